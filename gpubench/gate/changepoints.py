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
from the level on its left and from the level on its right (the medians of its
``OUTLIER_WINDOW`` neighbours on each side). A point at a step shares one side's level, so it
is never one; two wild points close together are not isolated either (they are kept). The
change points' indices are those of the whole series.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpubench.gate.stats import shift

DEFAULT_P_VALUE = 0.01
DEFAULT_PERMUTATIONS = 199
DEFAULT_MIN_SIZE = 3
DEFAULT_MAX_CHANGES = 20
CI_ALPHA = 0.05  # the reported interval is two-sided 95%


OUTLIER_SIGMAS = 6.0
OUTLIER_MIN_RATIO = 0.25  # and at least this far (in ratio) from the level on each side
OUTLIER_WINDOW = 3  # points on each side whose median is that side's level


def isolated_outliers(x: np.ndarray) -> np.ndarray:
    """A mask of the points of ``x`` (log values) that are isolated outliers: farther than the
    limit (OUTLIER_SIGMAS robust standard deviations, and at least OUTLIER_MIN_RATIO) from the
    median of the OUTLIER_WINDOW points before it and from that of the points after it (a
    point at a step shares the level of one side, so it is never one); near the ends, the sides
    with at least two points. Two within OUTLIER_WINDOW of each other are not isolated (both kept)."""
    n, w = len(x), OUTLIER_WINDOW
    mask = np.zeros(n, dtype=bool)
    if n < 2 * w + 1:
        return mask
    sigma = 1.4826 * float(np.median(np.abs(np.diff(x)))) / math.sqrt(2)
    limit = max(OUTLIER_SIGMAS * sigma, math.log1p(OUTLIER_MIN_RATIO))
    for i in range(n):
        sides = [x[max(0, i - w):i], x[i + 1:i + 1 + w]]
        levels = [float(np.median(side)) for side in sides if len(side) >= 2]
        mask[i] = bool(levels) and all(abs(x[i] - level) > limit for level in levels)
    found = mask.copy()  # counted on what was found, whatever is cleared
    for j in np.flatnonzero(found):
        if found[max(0, j - w):j + w + 1].sum() > 1:
            mask[max(0, j - w):j + w + 1] = False
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


def best_split(x: np.ndarray, min_size: int) -> tuple[int, float]:
    """The split of ``x`` with the largest Q: (points left of it, Q); (0, -inf) if too short."""
    if len(x) < 2 * min_size:
        return 0, -math.inf
    q = split_statistics(np.abs(x[:, None] - x[None, :]), min_size)
    k = int(np.argmax(q))
    return min_size + k, float(q[k])


def permutation_p(x: np.ndarray, observed: float, min_size: int, permutations: int, p_value: float,
                  rng: np.random.Generator) -> float:
    """Share of random orderings of ``x`` whose best Q reaches ``observed`` (with the observed
    one counted). Stops early once the answer is surely above ``p_value``."""
    d = np.abs(x[:, None] - x[None, :])
    reached, give_up = 0, math.floor(p_value * (permutations + 1))  # more than this: not significant
    for done in range(1, permutations + 1):
        p = rng.permutation(len(x))
        if split_statistics(d[np.ix_(p, p)], min_size).max() >= observed:
            reached += 1
            if reached > give_up:
                return (1 + reached) / (1 + done)  # a lower bound of the full test's p, already above
    return (1 + reached) / (1 + permutations)


def change_points(values: list[float] | np.ndarray, p_value: float = DEFAULT_P_VALUE,
                  permutations: int = DEFAULT_PERMUTATIONS, min_size: int = DEFAULT_MIN_SIZE,
                  max_changes: int = DEFAULT_MAX_CHANGES, seed: int = 0, drop_outliers: bool = True
                  ) -> list[ChangePoint]:
    """The change points of a series of positive values in order, earliest first;
    ``drop_outliers``: leave isolated outliers out first (``isolated_outliers``)."""
    if min_size < 2:
        raise ValueError("min_size must be at least 2")
    raw = np.asarray(values, dtype=float)
    if np.any(~np.isfinite(raw)) or np.any(raw <= 0):
        raise ValueError("the values must be finite and positive")
    keep = np.flatnonzero(~isolated_outliers(np.log(raw)) if drop_outliers else np.ones(len(raw), dtype=bool))
    raw = raw[keep]
    x = np.log(raw)
    rng = np.random.default_rng(seed)
    bounds = [0, len(x)]  # segment edges
    found: dict[int, float] = {}
    splits: dict[tuple[int, int], tuple[int, float]] = {}
    while len(found) < max_changes:
        for a, b in zip(bounds, bounds[1:]):
            if (a, b) not in splits:
                splits[(a, b)] = best_split(x[a:b], min_size)
        (a, b), (k, q) = max(splits.items(), key=lambda item: item[1][1])
        if k == 0 or not q > 0:
            break
        p = permutation_p(x[a:b], q, min_size, permutations, p_value, rng)
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
                               hi - at))
    return out
