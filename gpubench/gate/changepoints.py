"""Change points in a metric's series over commits: E-Divisive means with a permutation test.

The method of Matteson and James (2014), which MongoDB's and Apache Otava's (formerly Hunter)
performance CI use. On the log values (so a step is a ratio, whatever the metric's scale), for
a segment x of n points and a split at tau into a left part L (tau points) and a right part R
(m = n - tau points), the energy statistic

    Q(tau) = tau m / n * (2 mean|L_i - R_j| - mean|L_i - L_k| - mean|R_j - R_k|)

is large where the two sides differ in distribution (here: in level). The best split of a
segment is its largest Q over the splits that leave ``min_size`` points a side. Its
significance is a permutation test: the same maximum over ``permutations`` random orderings of
the segment, p = (1 + how many reach the observed) / (1 + permutations). Segmentation is
hierarchical: among the current segments, the one whose best split has the largest Q is tested;
a significant split (p <= ``p_value``) divides it and the search goes on, the first one that is
not significant ends it. Every pairwise distance is computed once per segment, and Q for every
split of a segment comes from one two-dimensional prefix sum, so one evaluation costs O(n^2).

Each change point's size and interval come from the gate's statistics (``gate.stats.shift``):
the Hodges-Lehmann ratio of the points after it to those before it, back to the neighbouring
change points, with its distribution-free confidence interval.

A single wild point (a run that stalled: 1.3k samples/s among 45k) would dominate every
distance of its segment and hide a real step beside it, so isolated outliers are left out
before the search (``isolated_outliers``, on the log values). A point is one when it lies more
than ``OUTLIER_SIGMAS`` robust standard deviations (from the median absolute difference of
consecutive points, which a step moves only once) and more than ``OUTLIER_MIN_RATIO`` away
from every one of its neighbours (``OUTLIER_WINDOW`` on each side). A point at a step is near
the points of its own side, so it is not one (beside an end, where its own side may be only a
wild point, it can be, with too few points after it to make a step anyway); two wild points close
together at the same level are not isolated either (they are kept). The change points'
indices are those of the whole series.

A short series is a limit of any permutation test: it cannot give a p-value below the share of
orderings that separate the two sides as well as the data does, 2 / C(n, k) for a split of n
points into k and n - k (2 / 120 for 7 | 3): a 40% step in 10 commits could never count at
p <= 0.01. Near that floor a test of ``permutations`` random orderings decides by chance (at
199 orderings, a true p of 0.009 counts about half the time). So in a series that short, while
the first split's floor is above a quarter of ``p_value`` (``SHORT_FLOOR_SHARE``), a split its
permutations did not find significant is tested instead by Student's t on the log values, its
p multiplied by the number of splits that were open to the search (Bonferroni over the
maximum), and only where its two sides do not overlap at all (every point of one above every
point of the other). The Bonferroni t-test holds false alarms to ``p_value`` under normal
noise; the no-overlap condition adds a guard where the noise has heavy tails, since without a
step a series of 10 points separates perfectly at some split with probability about 0.06 at
most (whatever the distribution). The segments after a split are left to their permutation
tests, as in a longer series: a second split tested so would add false change points beside a
real step. Such a change point says ``test = "t"``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from gpubench.gate.stats import shift

DEFAULT_P_VALUE = 0.01
DEFAULT_PERMUTATIONS = 199
DEFAULT_MIN_SIZE = 3
DEFAULT_MAX_CHANGES = 20
CI_ALPHA = 0.05  # the reported interval is two-sided 95%
SHORT_FLOOR_SHARE = 0.25  # Student's t for the first split while its permutation floor > this x p_value


OUTLIER_SIGMAS = 6.0
OUTLIER_MIN_RATIO = 0.25  # and at least this far (in ratio) from every neighbour
OUTLIER_WINDOW = 3  # neighbours on each side that an outlier is far from, every one


def isolated_outliers(x: np.ndarray) -> np.ndarray:
    """A mask of the points of ``x`` (log values) that are isolated outliers: farther than the
    limit (OUTLIER_SIGMAS robust standard deviations, and at least OUTLIER_MIN_RATIO) from every
    one of its neighbours, the OUTLIER_WINDOW points on each side (near the ends, those there
    are; at least two). A point at a step is near the points on its own side, so it is not
    one (unless its own side beside an end is only a wild point), and neither are two wild
    points close together at the same level (each is near the other: a short real excursion
    is kept)."""
    n, w = len(x), OUTLIER_WINDOW
    mask = np.zeros(n, dtype=bool)
    if n < 2 * w + 1:
        return mask
    sigma = 1.4826 * float(np.median(np.abs(np.diff(x)))) / math.sqrt(2)
    limit = max(OUTLIER_SIGMAS * sigma, math.log1p(OUTLIER_MIN_RATIO))
    for i in range(n):
        near = np.r_[x[max(0, i - w):i], x[i + 1:i + 1 + w]]
        mask[i] = len(near) >= 2 and bool(np.all(np.abs(near - x[i]) > limit))
    return mask


@dataclass(frozen=True)
class ChangePoint:
    index: int  # the first point after the step
    previous_index: int  # the last point before it (index - 1 unless an outlier between was left out)
    p_value: float
    ratio: float  # after / before: the Hodges-Lehmann ratio of the adjacent segments
    ci_low: float  # NaN when the segments are too short for a 95% interval
    ci_high: float
    n_before: int
    n_after: int
    test: str = "permutation"  # or "t": a short series' split tested by Student's t (module docstring)

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def split_statistics(d: np.ndarray, min_size: int) -> np.ndarray:
    """Q(tau) for tau = min_size .. n - min_size, from the segment's distance matrix ``d``."""
    n = len(d)
    s = np.zeros((n + 1, n + 1))
    s[1:, 1:] = d.cumsum(axis=0).cumsum(axis=1)
    t = np.arange(min_size, n - min_size + 1, dtype=float)
    ti = t.astype(int)
    m = n - t
    within_left = s[ti, ti]  # both orders of every pair
    between = s[ti, n] - within_left
    within_right = s[n, n] - s[ti, n] - s[n, ti] + within_left
    energy = 2 * between / (t * m) - within_left / (t * (t - 1)) - within_right / (m * (m - 1))
    out: np.ndarray = t * m / n * energy
    return out


def distances(x: np.ndarray) -> np.ndarray:
    """Every pairwise distance of the points of ``x``: |x_i - x_j| for a series; for series
    side by side (rows the commits, columns the series), the Euclidean distance of the rows."""
    if x.ndim == 1:
        out: np.ndarray = np.abs(x[:, None] - x[None, :])
        return out
    return np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=-1))


def best_split(x: np.ndarray, min_size: int) -> tuple[int, float]:
    """The split of ``x`` with the largest Q: (points left of it, Q); (0, -inf) if too short."""
    if len(x) < 2 * min_size:
        return 0, -math.inf
    q = split_statistics(distances(x), min_size)
    k = int(np.argmax(q))
    return min_size + k, float(q[k])


def permutation_p(x: np.ndarray, observed: float, min_size: int, permutations: int, p_value: float,
                  rng: np.random.Generator) -> float:
    """Share of random orderings of ``x`` whose best Q reaches ``observed`` (with the observed
    one counted). Stops early once the answer is surely above ``p_value``."""
    d = distances(x)
    reached, give_up = 0, math.floor(p_value * (permutations + 1))  # more than this: not significant
    for done in range(1, permutations + 1):
        p = rng.permutation(len(x))
        if split_statistics(d[np.ix_(p, p)], min_size).max() >= observed:
            reached += 1
            if reached > give_up:
                return (1 + reached) / (1 + done)  # a lower bound of the full test's p, already above
    return (1 + reached) / (1 + permutations)


def permutation_floor(n: int, k: int) -> float:
    """The smallest p-value a permutation test of a split of ``n`` points into ``k`` and n - k can
    give: the two orderings that separate the sides perfectly, 2 / C(n, k)."""
    return min(1.0, 2 / math.comb(n, k))


def short_split_p(x: np.ndarray, k: int, min_size: int) -> float | None:
    """For a split of ``x`` (log values) at ``k`` that its permutation test cannot resolve: when
    the two sides do not overlap, Student's t p-value (two-sided, pooled variance) times the
    number of splits open to the search; None when they overlap."""
    left, right = x[:k], x[k:]
    if not (left.max() < right.min() or left.min() > right.max()):
        return None
    splits = len(x) - 2 * min_size + 1
    if np.ptp(left) == 0 and np.ptp(right) == 0:
        return 0.0  # two flat levels: no noise at all to weigh the step against
    p = float(scipy_stats.ttest_ind(left, right).pvalue)
    return min(1.0, p * splits) if math.isfinite(p) else None


def change_points(values: list[float] | np.ndarray, p_value: float = DEFAULT_P_VALUE,
                  permutations: int = DEFAULT_PERMUTATIONS, min_size: int = DEFAULT_MIN_SIZE,
                  max_changes: int = DEFAULT_MAX_CHANGES, seed: int = 0, drop_outliers: bool = True,
                  short_splits: bool = True) -> list[ChangePoint]:
    """The change points of a series of positive values in order, earliest first;
    ``drop_outliers``: leave isolated outliers out first (``isolated_outliers``);
    ``short_splits``: in a series too short for its permutation test, test the first split by
    Student's t, when its sides do not overlap (the module's docstring).

    ``values`` may also be several series side by side (rows the commits, columns the series,
    on the same commits): the energy statistic then weighs the Euclidean distances of the rows,
    each series in units of its own spread, so a step that a change made in many series at once
    adds up over them. A row is left out where any of its series has an isolated outlier there;
    short splits are not t-tested; each change point's ratio and interval are those of the rows'
    geometric means."""
    if min_size < 2:
        raise ValueError("min_size must be at least 2")
    raw = np.asarray(values, dtype=float)
    if raw.ndim == 2 and raw.shape[1] == 1:
        raw = raw[:, 0]  # one series
    if raw.ndim not in (1, 2) or raw.size == 0:
        raise ValueError("expected a series, or series side by side (a 2-D array)")
    if np.any(~np.isfinite(raw)) or np.any(raw <= 0):
        raise ValueError("the values must be finite and positive")
    logs = np.log(raw)
    if drop_outliers:
        wild = isolated_outliers(logs) if raw.ndim == 1 else np.any(
            np.column_stack([isolated_outliers(col) for col in logs.T]), axis=1)
    else:
        wild = np.zeros(len(raw), dtype=bool)
    keep = np.flatnonzero(~wild)
    x = logs[keep]
    if raw.ndim == 2:
        # each series in units of its own spread (the median absolute deviation about its
        # median, which no reordering of the rows changes, so the permutation test stays
        # exact): one noisy series must not drown the others' shared step in the distances
        centred = x - np.median(x, axis=0)
        spread = np.median(np.abs(centred), axis=0)
        x = centred / np.where(spread > 0, spread, 1.0)
        short_splits = False
        raw = np.exp(logs[keep].mean(axis=1))  # the rows' geometric means: what each step's size is of
    else:
        raw = raw[keep]
    rng = np.random.default_rng(seed)
    bounds = [0, len(x)]  # segment edges
    found: dict[int, float] = {}
    by_t: set[int] = set()  # the change points tested by Student's t (short segments)
    splits: dict[tuple[int, int], tuple[int, float]] = {}
    while len(found) < max_changes:
        for a, b in zip(bounds, bounds[1:]):
            if (a, b) not in splits:
                splits[(a, b)] = best_split(x[a:b], min_size)
        (a, b), (k, q) = max(splits.items(), key=lambda item: item[1][1])
        if k == 0 or not q > 0:
            break
        p = permutation_p(x[a:b], q, min_size, permutations, p_value, rng)
        if (short_splits and (a, b) == (0, len(x)) and p > p_value
                and permutation_floor(b - a, k) > SHORT_FLOOR_SHARE * p_value):
            short = short_split_p(x[a:b], k, min_size)
            if short is not None and short <= p_value:
                p = short
                by_t.add(a + k)
        if p > p_value:
            break
        found[a + k] = p
        del splits[(a, b)]
        bounds = sorted([*bounds, a + k])
    edges = sorted(found)
    out = []
    for i, at in enumerate(edges):
        lo = edges[i - 1] if i else 0
        hi = edges[i + 1] if i + 1 < len(edges) else len(x)
        s = shift(raw[lo:at], raw[at:hi], CI_ALPHA)
        out.append(ChangePoint(int(keep[at]), int(keep[at - 1]), found[at], s.ratio, s.ci_low, s.ci_high, at - lo,
                               hi - at, "t" if at in by_t else "permutation"))
    return out
