"""Shift of a metric between two sets of per-process repeats, with a distribution-free CI.

The unit of replication is a fresh process (``run --repeats N``). On log values, the shift is
the Hodges-Lehmann estimate (median of all pairwise differences current - baseline), and its
confidence interval comes from the exact null distribution of the Mann-Whitney U statistic
(normal approximation for large samples). Exponentiated, both are ratios current/baseline.
No normality is assumed, and one slow outlier process moves neither much.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

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


# the null distribution of a rank statistic: its exact CDF (None beyond the exact limit), and the
# mean and standard deviation of its normal approximation
Null = tuple["np.ndarray | None", float, float]


def _u_null(n: int, m: int) -> Null:
    return (_u_cdf(n, m) if n * m <= EXACT_LIMIT else None), n * m / 2, math.sqrt(n * m * (n + m + 1) / 12)


def _interval_k(null: Null, alpha: float) -> int:
    """Largest k with P(S <= k - 1) <= alpha / 2 (0 when no interval reaches 1 - alpha): the
    k-th smallest and largest of the sorted differences (or Walsh averages) bound the interval."""
    cdf, mean, sd = null
    if cdf is not None:
        return int(np.searchsorted(cdf, alpha / 2, side="right"))
    return max(0, int(math.floor(mean - NormalDist().inv_cdf(1 - alpha / 2) * sd)))


def _p_at_least(null: Null, w: int) -> float:
    """P(S >= w) under the null (continuity-corrected beyond the exact limit)."""
    cdf, mean, sd = null
    if cdf is not None:
        return float(1.0 - cdf[w - 1]) if w > 0 else 1.0
    return float(1 - NormalDist().cdf((w - 0.5 - mean) / sd))


def _fewest(k_of: Callable[[int], int]) -> int:
    """Fewest samples n (2..59, else 60) for which ``k_of(n)`` gives an interval."""
    return next((n for n in range(2, 60) if k_of(n) >= 1), 60)


def _rank_k(n: int, m: int, alpha: float) -> int:
    """Largest k with P(U <= k - 1) <= alpha / 2 (0 when no interval reaches 1 - alpha)."""
    return _interval_k(_u_null(n, m), alpha)


def min_repeats(alpha: float) -> int:
    """Fewest repeats per side (equal sizes) for which a two-sided 1 - alpha interval exists."""
    return _fewest(lambda n: _rank_k(n, n, alpha))


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


def _hodges_lehmann(values: np.ndarray, k: int, n: int, m: int) -> Shift:
    """A Shift from the sorted pairwise differences (or Walsh averages) of log values: their
    median, and the k-th smallest and largest as the interval (NaN when k < 1)."""
    lo, hi = (math.exp(values[k - 1]), math.exp(values[len(values) - k])) if k >= 1 else (math.nan, math.nan)
    return Shift(math.exp(float(np.median(values))), lo, hi, n, m)


def shift(baseline: list[float] | np.ndarray, current: list[float] | np.ndarray, alpha: float) -> Shift:
    a = np.log(np.asarray(baseline, dtype=float))
    b = np.log(np.asarray(current, dtype=float))
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        raise ValueError("both sides need at least one value")
    return _hodges_lehmann(np.sort((b[None, :] - a[:, None]).ravel()), _rank_k(n, m, alpha), n, m)


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
    return _p_at_least(_u_null(n, m), w)


@lru_cache(maxsize=64)
def _signed_rank_cdf(n: int) -> np.ndarray:
    """P(T <= t) for t = 0..n(n+1)/2 under H0 (differences symmetric about 0), T = the Wilcoxon
    signed-rank statistic (the sum of the ranks of the positive differences)."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for k in range(1, n + 1):  # each rank k is in the positive set or not
        counts[k:] = counts[k:] + counts[:-k].copy()
    return np.cumsum(counts) / counts.sum()


SIGNED_RANK_EXACT_LIMIT = 300  # pairs up to which the exact signed-rank distribution is used


def _t_null(n: int) -> Null:
    return ((_signed_rank_cdf(n) if n <= SIGNED_RANK_EXACT_LIMIT else None), n * (n + 1) / 4,
            math.sqrt(n * (n + 1) * (2 * n + 1) / 24))


def _walsh_k(n: int, alpha: float) -> int:
    """Largest k with P(T <= k - 1) <= alpha / 2 for n pairs (0: no 1 - alpha interval)."""
    return _interval_k(_t_null(n), alpha)


def min_pairs(alpha: float) -> int:
    """Fewest pairs for which a two-sided 1 - alpha paired interval exists."""
    return _fewest(lambda n: _walsh_k(n, alpha))


def _walsh(d: np.ndarray) -> np.ndarray:
    """The Walsh averages (d_i + d_j) / 2, i <= j, sorted."""
    i, j = np.triu_indices(len(d))
    return np.sort((d[i] + d[j]) / 2.0)


def _paired_logs(baseline: list[float] | np.ndarray, current: list[float] | np.ndarray) -> np.ndarray:
    a, b = np.asarray(baseline, dtype=float), np.asarray(current, dtype=float)
    if len(a) != len(b) or len(a) == 0:
        raise ValueError("a paired comparison needs as many current values as baseline ones, at least one")
    return np.log(b) - np.log(a)


def paired_shift(baseline: list[float] | np.ndarray, current: list[float] | np.ndarray, alpha: float) -> Shift:
    """``shift`` for paired values (``current[i]`` measured beside ``baseline[i]``, as the two
    sides of one lockstep round are): on the per-pair log ratios, the Hodges-Lehmann estimate
    (median of the Walsh averages) and the interval from the exact Wilcoxon signed-rank
    distribution (normal approximation beyond SIGNED_RANK_EXACT_LIMIT pairs). What the two
    sides of a pair share (the machine's state while they ran) cancels in the ratio."""
    d = _paired_logs(baseline, current)
    return _hodges_lehmann(_walsh(d), _walsh_k(len(d), alpha), len(d), len(d))


def paired_p_below(baseline: list[float] | np.ndarray, current: list[float] | np.ndarray, ratio0: float) -> float:
    """``p_below`` for paired values: the one-sided Wilcoxon signed-rank test of "the per-pair
    ratio current/baseline is at least ``ratio0``", the test whose inversion gives
    ``paired_shift``'s interval (ties count a half, rounded down)."""
    d = _paired_logs(baseline, current) - math.log(ratio0)
    walsh = _walsh(d)
    w = int(math.floor(np.sum(walsh < 0) + 0.5 * np.sum(walsh == 0)))  # the signed-rank sum of the negatives
    return _p_at_least(_t_null(len(d)), w)


def round_spread(baseline: list[float] | np.ndarray, current: list[float] | np.ndarray) -> float | None:
    """The standard deviation of the paired log ratios (the noise a paired comparison sees);
    None below two pairs."""
    d = _paired_logs(baseline, current)
    return float(np.std(d, ddof=1)) if len(d) >= 2 else None


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
