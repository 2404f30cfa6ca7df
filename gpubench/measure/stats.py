"""Statistics of raw step times.

The median and percentiles describe a window of steps in one process. The 95% confidence
interval of the median is distribution-free (binomial order statistics), so it does not
assume normal step times; it describes within-process noise only. Between-process noise is
what ``run --repeats N`` and the regression gate measure.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

# A measurement whose step times vary more than this (coefficient of variation) is flagged.
NOISY_CV = 0.10


@dataclass(frozen=True)
class StepStats:
    n: int
    median: float
    mean: float
    p5: float
    p95: float
    iqr: float
    cv: float  # std / mean
    ci_low: float  # 95% CI of the median
    ci_high: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def median_ci(values: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free CI of the median from order statistics.

    Picks the narrowest symmetric pair of ranks (j, n-1-j) with P(X_(j) <= median <= X_(n-1-j))
    >= confidence. With fewer than 6 samples no pair reaches 95%, and (min, max) is returned.
    """
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if n == 0:
        return (math.nan, math.nan)
    j = _median_ci_rank(n, confidence)
    return (float(x[j]), float(x[n - 1 - j]))


def _median_ci_rank(n: int, confidence: float) -> int:
    """Largest 0-based rank j with P(j < B < n-j) >= confidence, B ~ Binomial(n, 1/2)
    (0 when even the full range falls short). Exact integer arithmetic up to n = 5000, a
    normal approximation above (scipy is not imported: it costs a worker a second)."""
    if n > 5000:
        z = {0.9: 1.6449, 0.95: 1.96, 0.99: 2.5758}.get(confidence, 1.96)
        return max(0, int(math.floor((n - z * math.sqrt(n)) / 2 - 1)))
    total = 2 ** n
    tail = 0  # P(B <= j) * 2**n, accumulated
    best = 0
    for j in range(n // 2):
        tail += math.comb(n, j)
        # coverage of [x_(j), x_(n-1-j)] = 1 - 2 * P(B <= j)
        if (total - 2 * tail) / total < confidence:
            break
        best = j
    return best


def step_stats(times_ms: list[float] | np.ndarray) -> StepStats:
    x = np.asarray(times_ms, dtype=float)
    if len(x) == 0:
        raise ValueError("no step times")
    p5, q1, med, q3, p95 = np.percentile(x, [5, 25, 50, 75, 95])
    mean = float(x.mean())
    cv = float(x.std(ddof=1) / mean) if len(x) > 1 and mean > 0 else 0.0
    lo, hi = median_ci(x)
    return StepStats(n=len(x), median=float(med), mean=mean, p5=float(p5), p95=float(p95),
                     iqr=float(q3 - q1), cv=cv, ci_low=lo, ci_high=hi)


@dataclass(frozen=True)
class Throughput:
    """Global samples per second, derived from step times: median = samples / median step."""

    median: float
    mean: float  # samples / mean step time: what a long run averages
    ci_low: float
    ci_high: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def throughput(st: StepStats, samples_per_step: int) -> Throughput:
    per_ms = samples_per_step * 1000.0
    return Throughput(median=per_ms / st.median, mean=per_ms / st.mean,
                      ci_low=per_ms / st.ci_high, ci_high=per_ms / st.ci_low)


def is_noisy(st: StepStats, threshold: float = NOISY_CV) -> bool:
    return st.cv > threshold
