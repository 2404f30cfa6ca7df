"""``gpubench history check``: the commits where a metric's series stepped.

A series is one config on one machine in one suite: per commit (in commit order), the median of
its ok results there. ``gate.changepoints`` finds the steps (E-Divisive means with a
permutation test) and sizes each with the gate's interval. A step whose good-direction ratio is
beyond the threshold is a regression or an improvement (smaller ones are listed as small); a
regression among the newest ``recent`` commits of its series fails the check (exit 1). The
dashboard (``history report``) marks the same steps on its charts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from gpubench.gate.changepoints import (
    DEFAULT_MIN_SIZE,
    DEFAULT_P_VALUE,
    DEFAULT_PERMUTATIONS,
    ChangePoint,
    change_points,
)
from gpubench.gate.render import change_text
from gpubench.results.metrics import BY_NAME


@dataclass(frozen=True)
class CheckOptions:
    p_value: float = DEFAULT_P_VALUE
    permutations: int = DEFAULT_PERMUTATIONS
    min_size: int = DEFAULT_MIN_SIZE
    threshold: float = 0.03  # a step smaller than this (good direction) is "small"
    recent: int = 5  # the newest commits of a series in which a regression fails the check
    last: int = 300  # only the newest commits of each series are searched (0: all); the cost grows as its square


@dataclass(frozen=True)
class Step:
    suite: str
    config_id: str
    machine: str
    metric: str
    commit: str  # the first commit after the step
    previous_commit: str  # the last commit before it
    position: int  # the commit's index in the suite's commit order
    points: int  # the series' length
    from_end: int  # how many of the series' points are at or after the step
    kind: str  # regression | improvement | small; change (a metric with no better direction)
    change: ChangePoint
    recent_window: int = CheckOptions.recent

    @property
    def recent_regression(self) -> bool:
        """A regression among the newest ``recent_window`` commits of its series."""
        return self.kind == "regression" and self.from_end <= self.recent_window

    def to_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "config_id": self.config_id, "machine": self.machine, "metric": self.metric,
                "commit": self.commit, "previous_commit": self.previous_commit, "position": self.position,
                "points": self.points, "from_end": self.from_end, "kind": self.kind,
                "recent_regression": self.recent_regression, **self.change.to_dict()}


def kind_of(ratio: float, metric: str, threshold: float) -> str:
    """regression, improvement or small; a metric that is no figure of merit (a counter such as
    SM occupancy) only ``change`` or small."""
    if not BY_NAME[metric].better:
        return "change" if abs(ratio - 1) >= threshold else "small"
    good = ratio if BY_NAME[metric].higher_is_better else 1 / ratio
    return "regression" if good <= 1 - threshold else "improvement" if good >= 1 + threshold else "small"


def series_points(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per (suite, config, machine, commit): the median of the metric over its ok results."""
    floor = BY_NAME[metric].floor
    if floor is not None:  # as the gate counts it (Metric.floor)
        frame = frame.assign(**{metric: frame[metric].where(~(frame[metric] < floor), floor)})
    d = frame[frame[metric].notna() & (frame[metric] > 0)]
    return d.groupby(["suite", "config_id", "machine", "commit"], sort=False)[metric].median().reset_index()


def find_steps(frame: pd.DataFrame, orders: dict[str, list[str]], metric: str,
               options: CheckOptions = CheckOptions()) -> tuple[list[Step], int]:
    """Every step of every series in ``frame`` (``dashboard.trend_frame``'s rows), in the
    suites' commit orders; and how many series were too short to test."""
    steps: list[Step] = []
    short = 0
    pts = series_points(frame, metric)
    for (suite, config, machine), g in pts.groupby(["suite", "config_id", "machine"], sort=True):
        position = {c: i for i, c in enumerate(orders[suite])}
        g = g.assign(x=g["commit"].map(position)).sort_values("x")
        if options.last:
            g = g.iloc[-options.last:]
        if len(g) < 2 * options.min_size:
            short += 1
            continue
        commits, xs = list(g["commit"]), list(g["x"])
        for cp in change_points(g[metric].to_numpy(), options.p_value, options.permutations, options.min_size):
            steps.append(Step(str(suite), str(config), str(machine), metric, str(commits[cp.index]),
                              str(commits[cp.previous_index]), int(xs[cp.index]), len(g), len(g) - cp.index,
                              kind_of(cp.ratio, metric, options.threshold), cp, options.recent))
    return steps, short


def p_text(step: Step) -> str:
    """A step's p-value, marked t where Student's t tested a split too short for its permutations."""
    return f"{step.change.p_value:.3g}" + (" t" if step.change.test == "t" else "")


def describe(step: Step) -> str:
    """The step's change and its 95% interval, as the gate's tables write a change."""
    return change_text(step.change.ratio, step.change.ci_low, step.change.ci_high)
