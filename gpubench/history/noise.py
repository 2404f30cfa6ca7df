"""``gpubench history noise``: each config's measured noise on each machine, and what the gate
can see with it.

The noise of a config on a machine is the spread of its metric between processes running the
same code: the results recorded at one commit (a run's repeats, and every run of that commit,
such as A/A runs) differ only by noise. Pooled over the commits with at least two results, the
standard deviation of the log values about each commit's mean (about the coefficient of
variation) is the noise level. With it, ``gate.power`` simulates the gate's own rule to state
the smallest slowdown caught 95% of the time with a given number of repeats, and the repeats a
given slowdown needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from gpubench.gate.power import MAX_REPEATS, MAX_SLOWDOWN, POWER, minimal_detectable, repeats_needed
from gpubench.gate.stats import pooled_log_sd


@dataclass(frozen=True)
class NoiseOptions:
    repeats: int = 10  # a side, for the minimal detectable slowdown
    alpha: float = 0.01
    configs: int = 1  # compared at once (Bonferroni: alpha / configs per config)
    threshold: float = 0.03
    noise_floor: float = 0.01
    effect: float = 0.05  # the slowdown whose repeats are asked for


@dataclass(frozen=True)
class Noise:
    suite: str
    config_id: str
    machine: str
    metric: str
    sigma: float  # pooled standard deviation of the log values within commits
    results: int  # results in commits with two or more
    commits: int  # commits with two or more results
    detectable: float | None  # the smallest slowdown caught POWER of the time (None: none up to 50%)
    repeats_for_effect: int | None


def pooled_noise(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per (suite, config, machine): sigma (``gate.stats.pooled_log_sd`` over its commits),
    results and commits, both counted over the commits with two or more results, from
    ``dashboard.trend_frame`` rows; series with no such commit are left out."""
    d = frame[frame[metric].notna() & (frame[metric] > 0)]
    rows = []
    for key, g in d.groupby(["suite", "config_id", "machine"], sort=True):
        groups = [list(v) for _, v in g.groupby("commit", sort=False)[metric] if len(v) >= 2]
        sigma = pooled_log_sd(groups)
        if sigma is not None:
            rows.append((*key, sigma, sum(len(v) for v in groups), len(groups)))
    return pd.DataFrame(rows, columns=["suite", "config_id", "machine", "sigma", "results", "commits"])


def noise_levels(frame: pd.DataFrame, metric: str, options: NoiseOptions = NoiseOptions()) -> list[Noise]:
    alpha_config = options.alpha / options.configs
    out = []
    for r in pooled_noise(frame, metric).itertuples():
        sigma = float(r.sigma)
        detectable = minimal_detectable(sigma, options.repeats, alpha_config, options.threshold, options.noise_floor)
        need = repeats_needed(sigma, options.effect, alpha_config, options.threshold, options.noise_floor)
        out.append(Noise(str(r.suite), str(r.config_id), str(r.machine), metric, sigma, int(r.results),
                         int(r.commits), detectable, need))
    return out


def sentence(n: Noise, options: NoiseOptions) -> str:
    """``CONFIG on MACHINE: noise X% between processes (...); with N repeats a side, a slowdown of
    Y% or more is caught 95% of the time; M repeats a side catch a 5% slowdown``."""
    caught = (f"a slowdown of {100 * n.detectable:.1f}% or more is caught {POWER:.0%} of the time"
              if n.detectable is not None
              else f"no slowdown up to {MAX_SLOWDOWN:.0%} is caught {POWER:.0%} of the time")
    need = (f"{n.repeats_for_effect} repeats a side catch a {100 * options.effect:g}% slowdown"
            if n.repeats_for_effect is not None else
            f"a {100 * options.effect:g}% slowdown needs more than {MAX_REPEATS} repeats a side"
            if options.effect > options.threshold else
            f"a {100 * options.effect:g}% slowdown is not above the {100 * options.threshold:g}% threshold")
    cv = f"{100 * (math.exp(n.sigma) - 1):.1f}%"
    return (f"{n.config_id} on {n.machine}: noise {cv} between processes ({n.results} results at {n.commits} "
            f"commit(s)); with {options.repeats} repeats a side, {caught}; {need}")
