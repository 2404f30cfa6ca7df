"""Shift of a metric between two sets of per-process repeats, with a distribution-free CI.

The unit of replication is a fresh process (``run --repeats N``). On log values, the shift is
the Hodges-Lehmann estimate (median of all pairwise differences current - baseline), and its
confidence interval comes from the exact null distribution of the Mann-Whitney U statistic
(normal approximation for large samples). Exponentiated, both are ratios current/baseline.
No normality is assumed, and one slow outlier process moves neither much.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

EXACT_LIMIT = 2500  # n * m up to which the exact U distribution is used


@lru_cache(maxsize=256)
def _u_cdf(n: int, m: int) -> np.ndarray:
    """P(U <= u) for u = 0..n*m under H0 (no shift), U = Mann-Whitney statistic."""
    # f[i][j] = counts over U for samples of sizes i, j; f(i, j, u) = f(i-1, j, u-j) + f(i, j-1, u)
    prev = [np.ones(1, dtype=np.float64) for _ in range(m + 1)]  # i = 0: only U = 0
    for i in range(1, n + 1):
        cur = [np.ones(1, dtype=np.float64)]  # j = 0
        for j in range(1, m + 1):
            a = np.zeros(i * j + 1)
            left = prev[j]  # f(i-1, j, .) shifted by j
            a[j: j + len(left)] += left
            below = cur[j - 1]  # f(i, j-1, .)
            a[: len(below)] += below
            cur.append(a)
        prev = cur
    counts = prev[m]
    return np.cumsum(counts) / counts.sum()


def _rank_k(n: int, m: int, alpha: float) -> int:
    """Largest k with P(U <= k - 1) <= alpha / 2 (0 when no interval reaches 1 - alpha)."""
    if n * m <= EXACT_LIMIT:
        cdf = _u_cdf(n, m)
        return int(np.searchsorted(cdf, alpha / 2, side="right"))
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1 - alpha / 2)
    mean, sd = n * m / 2, math.sqrt(n * m * (n + m + 1) / 12)
    return max(0, int(math.floor(mean - z * sd)))


def min_repeats(alpha: float) -> int:
    """Fewest repeats per side (equal sizes) for which a two-sided 1 - alpha interval exists."""
    for n in range(2, 60):
        if _rank_k(n, n, alpha) >= 1:
            return n
    return 60


@dataclass(frozen=True)
class Shift:
    """Ratio current/baseline of a metric: point estimate and CI (NaN bounds when the samples
    are too small for the requested confidence)."""

    ratio: float
    ci_low: float
    ci_high: float
    n_baseline: int
    n_current: int

    @property
    def has_ci(self) -> bool:
        return math.isfinite(self.ci_low) and math.isfinite(self.ci_high)


def shift(baseline: list[float] | np.ndarray, current: list[float] | np.ndarray, alpha: float) -> Shift:
    a = np.log(np.asarray(baseline, dtype=float))
    b = np.log(np.asarray(current, dtype=float))
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        raise ValueError("both sides need at least one value")
    diffs = np.sort((b[None, :] - a[:, None]).ravel())
    estimate = float(np.median(diffs))
    k = _rank_k(n, m, alpha)
    if k < 1:
        lo = hi = math.nan
    else:
        lo, hi = math.exp(diffs[k - 1]), math.exp(diffs[len(diffs) - k])
    return Shift(math.exp(estimate), lo, hi, n, m)


def p_below(baseline: list[float] | np.ndarray, current: list[float] | np.ndarray, ratio0: float) -> float:
    """One-sided p-value of "current/baseline is at least ``ratio0``" against "below it": the
    Mann-Whitney test of the log values, current shifted up by -log(ratio0), the test whose
    inversion gives ``shift``'s interval (its upper end is below ``ratio0`` at level 2 alpha
    exactly when this is at most alpha). Exact for small samples, normal approximation beyond
    EXACT_LIMIT; a tie counts a half, rounded down (the larger p-value)."""
    a = np.log(np.asarray(baseline, dtype=float))
    b = np.log(np.asarray(current, dtype=float)) - math.log(ratio0)
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        raise ValueError("both sides need at least one value")
    d = (b[None, :] - a[:, None]).ravel()
    w = int(math.floor(np.sum(d < 0) + 0.5 * np.sum(d == 0)))  # pairs where current is below
    if n * m <= EXACT_LIMIT:
        cdf = _u_cdf(n, m)
        return float(1.0 - cdf[w - 1]) if w > 0 else 1.0  # P(U >= w)
    from statistics import NormalDist

    mean, sd = n * m / 2, math.sqrt(n * m * (n + m + 1) / 12)
    return float(1 - NormalDist().cdf((w - 0.5 - mean) / sd))


def benjamini_hochberg(pvalues: list[float], alpha: float) -> list[bool]:
    """Which hypotheses Benjamini-Hochberg rejects at false-discovery rate ``alpha``: all whose
    p-value is at most the largest p_(k) with p_(k) <= k alpha / K (K = len(pvalues))."""
    k_total = len(pvalues)
    order = sorted(range(k_total), key=lambda i: pvalues[i])
    cut = 0
    for rank, i in enumerate(order, start=1):
        if pvalues[i] <= rank * alpha / k_total:
            cut = rank
    rejected = set(order[:cut])
    return [i in rejected for i in range(k_total)]


def pooled_log_sd(groups: list[list[float]]) -> float | None:
    """The standard deviation of the log values about each group's own mean, pooled over the
    groups of two or more values (about the coefficient of variation between the processes of
    one side, or of one commit); None when no group has two."""
    logs = [np.log(np.asarray(g, dtype=float)) for g in groups if len(g) >= 2]
    df = sum(len(g) - 1 for g in logs)
    if df < 1:
        return None
    return math.sqrt(sum(float(np.sum(np.square(g - g.mean()))) for g in logs) / df)
