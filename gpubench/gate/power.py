"""What the gate can see on a machine of a given noise: its minimal detectable slowdown, the
repeats a slowdown needs, and the rounds an undecided comparison needs (advise's guidance).

The noise is the between-process spread of a config's metric, as the standard deviation of
its log values (about its coefficient of variation), measured from results of the same code
(``history noise``). The gate's power is found by simulation with the gate's own rule
(``gate.stats.shift`` and ``gate.compare.judge``), never by a formula
that the distribution-free interval only approximates: ``trials`` comparisons of lognormal
repeats with that spread, a true slowdown on one side, counting how often the verdict is
``regressed``. Power grows with the slowdown, so the smallest slowdown caught at the wanted
rate is found by bisection.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpubench.gate.compare import judge
from gpubench.gate.stats import min_pairs, min_repeats, paired_shift, shift
from gpubench.results.metrics import GATE_METRICS

POWER = 0.95
GUIDE_POWER = 0.8  # "likely": the power of the rounds advise says an undecided practice needs
TRIALS = 400
MAX_SLOWDOWN = 0.5  # above this, "not detectable" (a slowdown of half the speed)
MAX_REPEATS = 60


def verdict_share(sigma: float, repeats: int, ratio: float, alpha_config: float, threshold: float,
                  noise_floor: float, verdicts: frozenset[str], trials: int = TRIALS, seed: int = 0,
                  paired: bool = False) -> float:
    """Share of ``trials`` simulated comparisons (``repeats`` a side, log-sd ``sigma``, the
    current side's throughput ``ratio`` times the baseline's) whose verdict is one of
    ``verdicts``, at one-sided level ``alpha_config`` per config. ``paired``: ``repeats``
    lockstep rounds, ``sigma`` the log-sd of a round's ratio current/baseline."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(trials):
        base = np.ones(repeats) if paired else np.exp(rng.normal(0.0, sigma, repeats))
        s = (paired_shift if paired else shift)(base, ratio * np.exp(rng.normal(0.0, sigma, repeats)), 2 * alpha_config)
        hits += judge(s, GATE_METRICS["throughput"], threshold, noise_floor) in verdicts
    return hits / trials


def caught_share(sigma: float, repeats: int, slowdown: float, alpha_config: float, threshold: float,
                 noise_floor: float, trials: int = TRIALS, seed: int = 0, paired: bool = False) -> float:
    """Share of simulated comparisons with the current side ``slowdown`` slower that the gate
    calls ``regressed`` (verdict_share)."""
    return verdict_share(sigma, repeats, 1 - slowdown, alpha_config, threshold, noise_floor, frozenset({"regressed"}),
                         trials, seed, paired)


def rounds_to_decide(sigma: float, ratio: float, alpha_config: float, threshold: float, noise_floor: float,
                     paired: bool, power: float = POWER, trials: int = TRIALS // 2) -> int | None:
    """The fewest repeats a side (rounds, when ``paired``) after which a true throughput
    ``ratio`` gets a verdict other than ``inconclusive`` at least ``power`` of the time at the
    noise ``sigma``; None beyond MAX_REPEATS (a ratio at the threshold is never decided)."""
    decided = frozenset({"improved", "regressed", "unchanged"})

    def enough(n: int) -> bool:
        return verdict_share(sigma, n, ratio, alpha_config, threshold, noise_floor, decided, trials,
                             paired=paired) >= power

    return _fewest(enough, (min_pairs if paired else min_repeats)(2 * alpha_config))


def _fewest(enough: Callable[[int], bool], lo: int) -> int | None:
    """The fewest repeats from ``lo`` to MAX_REPEATS that are ``enough`` (power grows with the
    repeats: bisected); None where even MAX_REPEATS is not."""
    hi = MAX_REPEATS
    if not enough(hi):
        return None
    if enough(lo):
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


def minimal_detectable(sigma: float, repeats: int, alpha_config: float, threshold: float, noise_floor: float,
                       power: float = POWER, trials: int = TRIALS, paired: bool = False) -> float | None:
    """The smallest slowdown (a fraction) caught at least ``power`` of the time with
    ``repeats`` a side (rounds, when ``paired``); None when even MAX_SLOWDOWN is not, or the
    repeats give no interval."""
    if repeats < (min_pairs if paired else min_repeats)(2 * alpha_config):
        return None

    def enough(slowdown: float) -> bool:
        return caught_share(sigma, repeats, slowdown, alpha_config, threshold, noise_floor, trials,
                            paired=paired) >= power

    lo, hi = threshold, MAX_SLOWDOWN
    if not enough(hi):
        return None
    for _ in range(12):  # to about 0.01 percentage points
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


def repeats_needed(sigma: float, slowdown: float, alpha_config: float, threshold: float, noise_floor: float,
                   power: float = POWER, trials: int = TRIALS) -> int | None:
    """The fewest repeats a side that catch ``slowdown`` at least ``power`` of the time; None
    beyond MAX_REPEATS."""
    if slowdown <= threshold:
        return None  # a slowdown at the threshold is caught about half the time, whatever the repeats
    def enough(n: int) -> bool:
        return caught_share(sigma, n, slowdown, alpha_config, threshold, noise_floor, trials) >= power

    return _fewest(enough, min_repeats(2 * alpha_config))
