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
