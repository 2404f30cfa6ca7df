"""``gpubench history report``: a self-contained HTML dashboard of the history's trends.

Per suite: one chart per config and metric, with the commits in commit order on the x axis
(by commit time, else the time of their first run), one series per machine: the median of
the config's ok results at that commit on that machine, and a band (the median of the
results' 95% CI bounds where the metric has them, such as throughput; else the range of the
results at that commit). Then a table per suite: for each config, machine and metric, the
latest value against the previous commit's and against the best commit's. Configs given with
``--pin`` come first in each suite. The change points that ``history check`` finds are marked
on the charts (a dashed line before the first commit after the step, labelled with its size)
and listed per suite.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from jinja2 import Environment, FileSystemLoader, select_autoescape  # noqa: E402

import gpubench  # noqa: E402
from gpubench import fmt  # noqa: E402
from gpubench.files import write_atomic, write_text_atomic  # noqa: E402
from gpubench.history.changes import CheckOptions, Step, describe, find_steps, p_text  # noqa: E402
from gpubench.history.db import display_url, translated_errors  # noqa: E402
from gpubench.history.query import Filters  # noqa: E402
from gpubench.history.schema import machines, results, runs  # noqa: E402
from gpubench.results.metrics import BY_NAME  # noqa: E402

DEFAULT_METRICS = ("throughput",)
# charted as well where no --metric is given and the history has them (GPU results with a
# calibrated peak or a datasheet row, Hopper's counters): how much of the GPU the throughput used
WHY_METRICS = ("mfu", "mfu_datasheet", "tensor_active_pct")
STYLE: dict[Any, Any] = {"figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
                         "axes.spines.right": False, "font.size": 8, "axes.titlesize": 9, "legend.fontsize": 7}
MAX_TICKS = 12  # commit labels on a chart's x axis


@dataclass
class Dashboard:
    index: Path
    charts: int
    warnings: list[str] = field(default_factory=list)


def trend_frame(engine: sa.Engine, url: str, f: Filters, metrics: list[str]) -> pd.DataFrame:
    """One row per ok result: suite, machine, commit, its order key, config and the metrics'
    figures (with their CI bounds where the registry has them)."""
    q = (sa.select(runs.c.suite, machines.c.hostname.label("machine"), runs.c.git_commit.label("commit"),
                   runs.c.commit_time, runs.c.created_at, results.c.config_id, results.c.figures)
         .join(machines, runs.c.machine_pk == machines.c.machine_pk)
         .join(results, results.c.run_pk == runs.c.run_pk)
         .where(results.c.status == "ok", *f.where()))
    if f.config:
        q = q.where(results.c.config_id.contains(f.config))
    wanted = [n for m in metrics for n in (m, f"{m}_ci_low", f"{m}_ci_high")]
    with translated_errors(url), engine.connect() as conn:
        rows = [(s, m, c or f"run {ca}", ct or ca, cfg, *(figs.get(n) for n in wanted))
                for s, m, c, ct, ca, cfg, fig in conn.execute(q) for figs in (json.loads(fig),)]
    frame = pd.DataFrame(rows, columns=["suite", "machine", "commit", "order", "config_id", *wanted])
    for name in wanted:  # a figure no result has is a column of None: make it NaN, as the others
        frame[name] = pd.to_numeric(frame[name], errors="coerce")
    return frame


def _points(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per (suite, config, machine, commit): the median and the band."""
    lo, hi = f"{metric}_ci_low", f"{metric}_ci_high"
    d = frame[frame[metric].notna()]
    g = d.groupby(["suite", "config_id", "machine", "commit"], sort=False)
    out = g.agg(value=(metric, "median"), low=(lo, "median"), high=(hi, "median"), vmin=(metric, "min"),
                vmax=(metric, "max")).reset_index()
    no_ci = out["low"].isna() | out["high"].isna()
    out.loc[no_ci, "low"], out.loc[no_ci, "high"] = out.loc[no_ci, "vmin"], out.loc[no_ci, "vmax"]
    return out


def commit_order(frame: pd.DataFrame) -> dict[str, list[str]]:
    """Per suite, its commits in commit order (commit time, else first run's time)."""
    first = frame.groupby(["suite", "commit"])["order"].min().reset_index().sort_values(["suite", "order", "commit"])
    return {s: list(g["commit"]) for s, g in first.groupby("suite", sort=True)}


def _chart(pts: pd.DataFrame, commits: list[str], metric: str, title: str, path: Path,
           steps: list[Step] | None = None) -> bytes:
    """The chart, written atomically to ``path`` as a PNG; returns its bytes (for the page)."""
    m = BY_NAME[metric]
    position = {c: i for i, c in enumerate(commits)}
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 2.4))
        for machine, g in pts.groupby("machine", sort=True):
            g = g.assign(x=g["commit"].map(position)).sort_values("x")
            line, = ax.plot(g["x"], g["value"], marker="o" if len(g) <= 60 else None, markersize=3, linewidth=1.2,
                            label=str(machine))
            ax.fill_between(g["x"], g["low"], g["high"], color=line.get_color(), alpha=0.2, linewidth=0)
            for st in steps or []:
                if st.machine == str(machine):
                    colour = "tab:red" if st.kind == "regression" else line.get_color()
                    ax.axvline(st.position - 0.5, color=colour, linestyle="--", linewidth=1)
                    ax.annotate(f"{100 * (st.change.ratio - 1):+.1f}%", (st.position - 0.5, 1.0),
                                xycoords=("data", "axes fraction"), fontsize=7, color=colour, ha="left", va="top")
        step = max(1, int(np.ceil(len(commits) / MAX_TICKS)))
        ticks = list(range(0, len(commits), step))
        ax.set_xticks(ticks, [commits[i][:8] for i in ticks], rotation=30, ha="right")
        ax.set_xlim(-0.5, max(len(commits) - 0.5, 0.5))
        ax.set_ylabel(f"{metric} ({m.unit})" if m.unit else metric)
        ax.set_title(title)
        ax.legend(loc="best", frameon=False)
        fig.tight_layout()
        write_atomic(path, lambda p: fig.savefig(p, format="png"))
        plt.close(fig)
    return path.read_bytes()


def _at(kind: str, point: pd.Series) -> str:
    """A point's value and its commit: ``970.3 @ 9ae22f64``."""
    return f"{fmt.metric(kind, point['value'])} @ {str(point['commit'])[:8]}"


def _change(new: float, old: float) -> str:
    return f"{100.0 * (new / old - 1):+.1f}%" if old else "-"


def latest_table(pts: pd.DataFrame, commits: list[str], metric: str) -> list[dict[str, str]]:
    """Per config and machine: the latest commit's value, the previous one's and the best."""
    m = BY_NAME[metric]
    position = {c: i for i, c in enumerate(commits)}
    rows = []
    for (config, machine), g in pts.groupby(["config_id", "machine"], sort=False):
        g = g.assign(x=g["commit"].map(position)).sort_values("x")
        last = g.iloc[-1]
        prev = g.iloc[-2] if len(g) > 1 else None
        best = g.loc[g["value"].idxmax() if m.better != "lower" else g["value"].idxmin()]
        rows.append({"config": str(config), "machine": str(machine), "metric": metric,
                     "latest": _at(m.kind, last),
                     "previous": "-" if prev is None else _at(m.kind, prev),
                     "vs previous": "-" if prev is None else _change(last["value"], prev["value"]),
                     "best": _at(m.kind, best),
                     "vs best": _change(last["value"], best["value"]),
                     "commits": str(len(g))})
    return rows


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:120]


def build_dashboard(engine: sa.Engine, url: str, out: Path, f: Filters | None = None,
                    metrics: list[str] | None = None, pinned: list[str] | None = None,
                    changes: CheckOptions | None = CheckOptions()) -> Dashboard:
    """The dashboard in ``out``; ``changes``: how change points are found for the charts (None:
    not looked for)."""
    f = f or Filters()
    chosen = bool(metrics)
    metrics = list(metrics or (*DEFAULT_METRICS, *WHY_METRICS))
    pinned = list(pinned or [])
    frame = trend_frame(engine, url, f, metrics)
    if not chosen:  # the counters only where some result has them
        metrics = [m for m in metrics if m in DEFAULT_METRICS or frame[m].notna().any()]
    warnings = []
    if frame.empty:
        warnings.append("no ok results in the history" + (" for these filters" if f != Filters() else ""))
    orders = commit_order(frame) if not frame.empty else {}
    known = set(frame["config_id"]) if not frame.empty else set()
    warnings += [f"--pin {p}: no ok result of that config in the history" for p in pinned if p not in known]
    charts_dir = out / "charts"
    charts_dir.mkdir(parents=True, exist_ok=True)
    suites, n_charts = [], 0
    for suite, commits in orders.items():
        sections, table = [], []
        in_suite = frame[frame["suite"] == suite]
        configs = sorted(set(in_suite["config_id"]), key=lambda c: (c not in pinned, pinned.index(c) if c in pinned
                                                                    else 0, c))
        by_metric = {metric: _points(in_suite, metric) for metric in metrics}
        steps: list[Step] = []
        too_short = 0
        for metric, pts in by_metric.items():
            table += latest_table(pts, commits, metric)
            if changes is not None:
                found, short = find_steps(in_suite, {suite: commits}, metric, changes)
                steps += found
                too_short += short
        for config in configs:
            for metric in metrics:
                pts = by_metric[metric][by_metric[metric]["config_id"] == config]
                if pts.empty:
                    continue
                name = f"{_slug(suite)}/{_slug(config)}-{metric}.png"
                (charts_dir / name).parent.mkdir(parents=True, exist_ok=True)
                png = _chart(pts, commits, metric, f"{config}: {metric}", charts_dir / name,
                             [st for st in steps if st.config_id == config and st.metric == metric])
                sections.append({"config": config, "metric": metric, "pinned": config in pinned, "name": name,
                                 "data": base64.b64encode(png).decode()})
                n_charts += 1
        table.sort(key=lambda r: (r["config"] not in pinned, r["config"], r["machine"], r["metric"]))
        suites.append({"name": suite, "commits": len(commits), "first": commits[0][:8], "last": commits[-1][:8],
                       "machines": sorted(set(in_suite["machine"])), "charts": sections,
                       "table": table, "too_short": too_short,
                       "min_commits": 2 * changes.min_size if changes else None,
                       "changes": None if changes is None else [
                           {"config": st.config_id, "machine": st.machine, "metric": st.metric,
                            "at": f"{st.previous_commit[:8]} -> {st.commit[:8]}", "change": describe(st),
                            "p": p_text(st), "kind": st.kind} for st in steps]})
    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                      autoescape=select_autoescape(["html", "j2"]))
    page = env.get_template("dashboard.html.j2").render(
        title=display_url(url), generated=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        version=gpubench.__version__, suites=suites, warnings=warnings, metrics=metrics, pinned=pinned)
    index = out / "index.html"
    write_text_atomic(index, page)
    return Dashboard(index, n_charts, warnings)
