"""``gpubench history check``: the commits where a metric's series stepped.

A series is one config on one machine in one suite: per commit (in commit order), the median of
its ok results there. ``gate.changepoints`` finds the steps (E-Divisive means with a
permutation test) and sizes each with the gate's interval. A step whose good-direction ratio is
beyond the threshold is a regression or an improvement (smaller ones are listed as small); a
regression among the newest ``recent`` commits of its series fails the check (exit 1). The
dashboard (``history report``) marks the same steps on its charts.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from gpubench.gate.changepoints import (
    CI_ALPHA,
    DEFAULT_MIN_SIZE,
    DEFAULT_P_VALUE,
    DEFAULT_PERMUTATIONS,
    ChangePoint,
    change_points,
    isolated_outliers,
)
from gpubench.gate.render import change_text
from gpubench.gate.stats import shift
from gpubench.results.metrics import BY_NAME


@dataclass(frozen=True)
class CheckOptions:
    p_value: float = DEFAULT_P_VALUE
    permutations: int = DEFAULT_PERMUTATIONS
    min_size: int = DEFAULT_MIN_SIZE
    threshold: float = 0.03  # a step smaller than this (good direction) is "small"
    recent: int = 5  # the newest commits of a series in which a regression fails the check
    last: int = 300  # only the newest commits of each series are searched (0: all); the cost grows as its square
    together: bool = False  # search the configs of a suite on a machine together (find_steps)


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
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("change", "recent_window")},
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
    suites' commit orders; and how many series were too short to test. With
    ``options.together``, the series of a suite on a machine are searched together
    (``_together``)."""
    pts = series_points(frame, metric)
    if not options.together:
        return _alone(pts, orders, metric, options)
    parts = [_together(g, orders[str(suite)], metric, options) for (suite, _), g in pts.groupby(["suite", "machine"])]
    return [st for found, _ in parts for st in found], sum(short for _, short in parts)


def _alone(pts: pd.DataFrame, orders: dict[str, list[str]], metric: str,
           options: CheckOptions) -> tuple[list[Step], int]:
    """The steps of each series of ``pts`` (``series_points``' rows) searched on its own; and
    how many series were too short to test."""
    steps: list[Step] = []
    short = 0
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


def _together(g: pd.DataFrame, order: list[str], metric: str, options: CheckOptions) -> tuple[list[Step], int]:
    """The steps of one suite's configs on one machine, searched together. Within the newest
    ``--last`` commits, the configs measured at the newest commit and at no fewer than half of
    the commits are rows' columns, on the commits they all have (the others are searched
    alone, as are all of them where fewer than twice ``--min-size`` commits remain or only one
    config joins); a step that one change made in many configs adds up over them. Every joined
    config gets a step at each change point found so (``small`` where it did not move), sized on
    its own series (its own isolated outliers left out) between the neighbouring change points;
    its p is the joint test's (``test`` = "together")."""
    position = {c: i for i, c in enumerate(order)}
    wide = g.pivot_table(index="commit", columns="config_id", values=metric, aggfunc="median")
    wide = wide.loc[sorted(wide.index, key=position.__getitem__)]
    if options.last:
        wide = wide.iloc[-options.last:]
    newest = wide.iloc[-1] if len(wide) else pd.Series(dtype=float)
    many = [c for c in wide.columns if pd.notna(newest[c]) and wide[c].notna().sum() * 2 >= len(wide)]
    rows = wide[many].dropna()
    if len(many) < 2 or len(rows) < 2 * options.min_size:
        many = []
    suite, machine = str(g["suite"].iloc[0]), str(g["machine"].iloc[0])
    steps, short = _alone(g[~g["config_id"].isin(many)], {suite: order}, metric, options)
    if not many:
        return steps, short
    commits = list(rows.index)
    cps = change_points(rows.to_numpy(dtype=float), options.p_value, options.permutations, options.min_size)
    edges = [commits[cp.index] for cp in cps]
    series = {}  # each config's own series in the window, and its isolated outliers
    for config in many:
        own = wide[config].dropna()
        series[config] = own, own.to_numpy(dtype=float), isolated_outliers(np.log(own.to_numpy(dtype=float)))
    for i, cp in enumerate(cps):
        lo = edges[i - 1] if i else None
        hi = edges[i + 1] if i + 1 < len(edges) else None
        for config in many:
            own, values, wild = series[config]
            at = own.index.get_loc(commits[cp.index])
            start = own.index.get_loc(lo) if lo is not None else 0
            end = own.index.get_loc(hi) if hi is not None else len(own)
            before = values[start:at][~wild[start:at]]
            after = values[at:end][~wild[at:end]]
            s = shift(before, after, CI_ALPHA)
            change = ChangePoint(at, own.index.get_loc(commits[cp.previous_index]), cp.p_value, s.ratio, s.ci_low,
                                 s.ci_high, len(before), len(after), "together")
            steps.append(Step(suite, str(config), machine, metric, str(commits[cp.index]),
                              str(commits[cp.previous_index]), position[commits[cp.index]], len(own),
                              len(own) - at, kind_of(s.ratio, metric, options.threshold), change, options.recent))
    return steps, short


def p_text(step: Step) -> str:
    """A step's p-value, marked t where Student's t tested a split too short for its permutations
    (below the smallest double, as for two levels without noise, it reads ``< 1e-300``)."""
    p = step.change.p_value
    return (f"{p:.3g}" if p >= 1e-300 else "< 1e-300") + {"t": " t", "together": " together"}.get(step.change.test, "")


def describe(step: Step) -> str:
    """The step's change and its 95% interval, as the gate's tables write a change."""
    return change_text(step.change.ratio, step.change.ci_low, step.change.ci_high)
