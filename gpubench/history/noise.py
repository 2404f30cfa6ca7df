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
from typing import Any

import numpy as np
import pandas as pd

from gpubench.gate.power import POWER, minimal_detectable, repeats_needed


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

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def pooled_noise(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per (suite, config, machine): sigma, results and commits, from ``dashboard.trend_frame``
    rows; series with no commit of two results are left out."""
    d = frame[frame[metric].notna() & (frame[metric] > 0)].assign(log=lambda x: np.log(x[metric]))
    keys = ["suite", "config_id", "machine"]
    g = d.groupby([*keys, "commit"])["log"]
    d = d.assign(dev=d["log"] - g.transform("mean"), n=g.transform("size"))
    d = d[d["n"] >= 2]
    out = d.groupby(keys).agg(ss=("dev", lambda v: float(np.sum(np.square(v)))), results=("dev", "size"),
                              commits=("commit", "nunique")).reset_index()
    out["sigma"] = np.sqrt(out["ss"] / (out["results"] - out["commits"]))
    return out.drop(columns="ss")


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
    """``with 10 repeats on vm, a slowdown of 6.0% or more is caught 95% of the time ...``"""
    caught = (f"a slowdown of {100 * n.detectable:.1f}% or more is caught {POWER:.0%} of the time"
              if n.detectable is not None else f"no slowdown up to 50% is caught {POWER:.0%} of the time")
    need = (f"{n.repeats_for_effect} repeats a side catch a {100 * options.effect:g}% slowdown"
            if n.repeats_for_effect is not None else
            f"a {100 * options.effect:g}% slowdown needs more than 60 repeats a side"
            if options.effect > options.threshold else
            f"a {100 * options.effect:g}% slowdown is not above the {100 * options.threshold:g}% threshold")
    cv = f"{100 * (math.exp(n.sigma) - 1):.1f}%"
    return (f"{n.config_id} on {n.machine}: noise {cv} between processes ({n.results} results at {n.commits} "
            f"commit(s)); with {options.repeats} repeats a side, {caught}; {need}")
