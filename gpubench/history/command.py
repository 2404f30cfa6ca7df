"""``gpubench history ingest | list | show | export | report | check``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from gpubench import fmt
from gpubench.errors import EXIT_OK, EXIT_REGRESSED, InputError, warn
from gpubench.files import write_atomic
from gpubench.gate.power import MAX_REPEATS, MAX_SLOWDOWN
from gpubench.history.changes import CheckOptions, Step, describe, find_steps, p_text
from gpubench.history.dashboard import DEFAULT_METRICS, build_dashboard, commit_order, trend_frame
from gpubench.history.db import display_url, open_engine
from gpubench.history.noise import NoiseOptions, noise_levels, sentence
from gpubench.history.query import Filters, list_runs, load_history
from gpubench.history.store import ingest_runs
from gpubench.results.metrics import BY_NAME
from gpubench.results.outputs import check_output_dir, check_output_file, write_output
from gpubench.results.store import json_text

SHOW_METRICS = ("throughput", "step_ms")  # history show's figures unless --metric says others
EXPORT_SUFFIXES = (".csv", ".parquet")


@dataclass
class HistoryRequest:
    action: str  # ingest | list | show | export
    db: str | None = None
    run_dirs: list[Path] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    filters: Filters = field(default_factory=Filters)
    metrics: list[str] = field(default_factory=list)
    out: Path | None = None
    pinned: list[str] = field(default_factory=list)
    check: CheckOptions = field(default_factory=CheckOptions)
    json: Path | None = None
    changes: bool = True  # history report: mark the change points on the charts
    noise: NoiseOptions = field(default_factory=NoiseOptions)
    # history check --bisect: what bisects the newest regression found, given the commits before
    # and after its step (the command line's gpubench bisect); its exit code is check's
    bisect: Callable[[str, str], int] | None = None


def noise_options(repeats: int, alpha: float, configs: int, threshold: float, noise_floor: float,
                  effect: str) -> NoiseOptions:
    """``history noise``'s options, checked before the history is opened."""
    from gpubench.gate.compare import parse_fraction

    if repeats < 2:
        raise InputError(f"--repeats {repeats}: must be at least 2")
    if configs < 1:
        raise InputError(f"--configs {configs}: must be at least 1")
    return NoiseOptions(repeats, alpha, configs, threshold, noise_floor, parse_fraction(effect, "--effect"))


def check_options(p_value: float, permutations: int, min_size: int, threshold: float, recent: int,
                  last: int = CheckOptions.last, together: bool = False) -> CheckOptions:
    """``history check``'s options, checked before the history is opened."""
    if not 0 < p_value < 1:
        raise InputError(f"--p-value {p_value:g}: must be between 0 and 1")
    if permutations < 1 or 1 / (permutations + 1) > p_value:
        raise InputError(f"--permutations {permutations}: at --p-value {p_value:g} needs at least "
                         f"{int(-(-1 // p_value)) - 1} (the smallest p-value is 1 / (permutations + 1))")
    if min_size < 2:
        raise InputError(f"--min-size {min_size}: must be at least 2 (commits on each side of a step)")
    if recent < 1:
        raise InputError(f"--recent {recent}: must be at least 1")
    if last < 0 or 0 < last < 2 * min_size:
        raise InputError(f"--last {last}: must be 0 (every commit) or at least {2 * min_size} (twice --min-size)")
    return CheckOptions(p_value, permutations, min_size, threshold, recent, last, together)


def _check_metrics(names: list[str]) -> list[str]:
    for name in names:
        if name not in BY_NAME:
            raise InputError(f"--metric {name}: unknown metric; one of: {', '.join(sorted(BY_NAME))}")
    return names or list(SHOW_METRICS)


def _check_export(out: Path | None) -> Path:
    if out is None or out.suffix not in EXPORT_SUFFIXES:
        raise InputError(f"--out {out}: give a file ending in {' or '.join(EXPORT_SUFFIXES)}")
    if out.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise InputError(f"--out {out}: Parquet needs pyarrow (pip install pyarrow); or write .csv") from None
    return out


def _write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """Parquet wants one type per column: a column of mixed Python objects (a label that is a
    number in one result and text in another) is written as text."""
    try:
        frame.to_parquet(path, index=False)
    except (TypeError, ValueError):  # pyarrow's ArrowTypeError and ArrowInvalid are these
        mixed = {c: "string" for c in frame.columns if frame[c].dtype == object}
        frame.astype(mixed).to_parquet(path, index=False)


def _cell(v: object) -> str:
    return "" if v is None or (isinstance(v, float) and pd.isna(v)) else str(v)


def run_history(req: HistoryRequest, console: Console) -> int:
    if req.action == "report":  # none named: the dashboard picks (DEFAULT_METRICS and the counters results have)
        metrics = _check_metrics(req.metrics) if req.metrics else []
    else:
        metrics = (_check_metrics(req.metrics) if req.action == "show" else
                   _check_metrics(req.metrics or list(DEFAULT_METRICS)) if req.action in ("check", "noise") else [])
    check_output_file(req.json, "--json")
    if req.action == "report":
        check_output_dir(req.out, "--out")
    out = _check_export(req.out) if req.action == "export" else None
    if req.action == "ingest":
        for d in req.run_dirs:
            if not d.is_dir():
                raise InputError(f"{d}: no such run directory")
    engine, url = open_engine(req.db)
    try:
        if req.action == "ingest":
            for d, added, had in ingest_runs(engine, url, req.run_dirs, req.tags):
                console.print(f"{d}: {added} result(s) added, {had} already in the history", highlight=False)
            console.print(f"history: {display_url(url)}", highlight=False)
            return EXIT_OK
        if req.action == "list":
            frame = list_runs(engine, url, req.filters)
            table = Table("run", "suite", "machine", "commit", "branch", "created", "complete", "results ok/all",
                          title=f"runs in {display_url(url)}")
            for r in frame.itertuples():
                table.add_row(r.run_id, r.suite, r.hostname, _cell(r.commit)[:12], _cell(r.branch), r.created_at,
                              "yes" if r.complete else "no", f"{int(r.ok or 0)}/{int(r.results)}")
            console.print(table)
            console.print(f"{len(frame)} run(s)", highlight=False)
            return EXIT_OK
        if req.action == "check":
            return _check(engine, url, req, metrics, console)
        if req.action == "noise":
            return _noise(engine, url, req, metrics, console)
        if req.action == "report":
            assert req.out is not None
            dash = build_dashboard(engine, url, req.out, req.filters, metrics, req.pinned,
                                   req.check if req.changes else None)
            for w in dash.warnings:
                warn(w)
            console.print(f"dashboard: {dash.index} ({dash.charts} charts)", highlight=False)
            return EXIT_OK
        frame = load_history(engine, url, req.filters)
        if req.action == "export":
            assert out is not None
            out.parent.mkdir(parents=True, exist_ok=True)
            if out.suffix == ".parquet":
                write_atomic(out, lambda tmp: _write_parquet(frame, tmp))
            else:
                write_atomic(out, lambda tmp: frame.to_csv(tmp, index=False))
            console.print(f"{len(frame)} result(s) -> {out}", highlight=False)
            return EXIT_OK
        table = Table("run", "commit", "machine", "config", "repeat", "status", *metrics,
                      title=f"results in {display_url(url)}")
        for _, r in frame.iterrows():
            figures = [fmt.metric(BY_NAME[m].kind, r.get(m)) if r["status"] == "ok" else "" for m in metrics]
            table.add_row(r["run_id"], _cell(r["commit"])[:12], r["machine"], r["config_id"], str(r["repeat"]),
                          r["status"], *figures)
        console.print(table)
        console.print(f"{len(frame)} result(s)", highlight=False)
        return EXIT_OK
    finally:
        engine.dispose()


def _ok_results(engine: Any, url: str, req: HistoryRequest, metrics: list[str], what: str) -> pd.DataFrame:
    """The filtered ok results (``trend_frame``); none is bad input (exit 2)."""
    frame = trend_frame(engine, url, req.filters, metrics)
    if frame.empty:
        raise InputError(f"{display_url(url)}: no ok results" + (" for these filters" if req.filters != Filters()
                                                                  else "") + f"; nothing to {what}")
    return frame


def _noise(engine: Any, url: str, req: HistoryRequest, metrics: list[str], console: Console) -> int:
    """Each config's noise per machine and the gate's minimal detectable slowdown with it."""
    frame = _ok_results(engine, url, req, metrics, "measure")
    o = req.noise
    levels = [n for metric in metrics for n in noise_levels(frame, metric, o)]
    console.print(f"noise in {display_url(url)}: the spread between processes of the same commit; the gate at "
                  f"alpha {o.alpha:g} over {o.configs} config(s), threshold {100 * o.threshold:g}%, noise floor "
                  f"{100 * o.noise_floor:g}% (simulated with the gate's own rule)", highlight=False, soft_wrap=True)
    if not levels:
        console.print("no commit has two results of one config on one machine: run with --repeats 2 or more "
                      "(or run the same commit twice) to measure the noise", highlight=False)
    else:
        table = Table("suite", "config", "machine", "metric", "noise (cv)", "results / commits",
                      f"caught 95% with {o.repeats} repeats", f"repeats for {100 * o.effect:g}%")
        for n in levels:
            table.add_row(n.suite, n.config_id, n.machine, n.metric, f"{100 * (math.exp(n.sigma) - 1):.1f}%",
                          f"{n.results} / {n.commits}",
                          f"none up to {MAX_SLOWDOWN:.0%}" if n.detectable is None else f">= {100 * n.detectable:.1f}%",
                          f"more than {MAX_REPEATS}" if n.repeats_for_effect is None else str(n.repeats_for_effect))
        console.print(table)
        for n in levels:
            console.print(sentence(n, o), highlight=False, soft_wrap=True)
    if req.json:
        write_output(req.json, json_text({"history": display_url(url), "options": asdict(o),
                                          "noise": [asdict(n) for n in levels]}), "--json")
    return EXIT_OK


def _check(engine: Any, url: str, req: HistoryRequest, metrics: list[str], console: Console) -> int:
    """Print every step of every series, and exit 1 when one is a regression among its
    series' newest commits; a history with nothing to check is bad input (exit 2)."""
    frame = _ok_results(engine, url, req, metrics, "check")
    orders = commit_order(frame)
    parts = [find_steps(frame, orders, metric, req.check) for metric in metrics]
    steps, short = [st for found, _ in parts for st in found], sum(n for _, n in parts)
    o = req.check
    console.print(f"change points in {display_url(url)}: E-Divisive means, p <= {o.p_value:g} "
                  f"({o.permutations} permutations; a split too short for them, by Student's t where its sides do not "
                  f"overlap: p marked t), at least {o.min_size} commits a side"
                  + ("; the configs of each suite and machine searched together (p marked together)" if o.together
                     else "") + f"; a step beyond "
                  f"{100 * o.threshold:g}% is a regression or improvement; regressions in the newest {o.recent} "
                  "commits of a series fail the check; "
                  + (f"the newest {o.last} commits of each series searched" if o.last else "every commit searched"),
                  highlight=False, soft_wrap=True)
    if steps:
        table = Table("suite", "config", "machine", "metric", "step at", "change [95% CI]", "p", "kind")
        for st in steps:
            kind = f"[red]{st.kind}, recent[/red]" if st.recent_regression else st.kind
            table.add_row(st.suite, st.config_id, st.machine, st.metric,
                          f"{st.previous_commit[:8]} -> {st.commit[:8]}", describe(st), p_text(st),
                          kind)
        console.print(table)
    series = frame.groupby(["suite", "config_id", "machine"]).ngroups
    recent = [st for st in steps if st.recent_regression]
    console.print(f"{len(steps)} step(s) in {series} series" + (f"; {short} series too short to test (fewer than "
                  f"{2 * o.min_size} commits)" if short else ""), highlight=False)
    console.print(f"[red]REGRESSION[/red] in the newest commits: {len(recent)} series" if recent else
                  "no regression in the newest commits", highlight=False)
    if req.json:
        write_output(req.json, json_text({"history": display_url(url), "options": asdict(o),
                                          "steps": [st.to_dict() for st in steps], "too_short": short}), "--json")
    if req.bisect:
        return _bisect(req, steps, console)
    return EXIT_REGRESSED if recent else EXIT_OK


def _bisect(req: HistoryRequest, steps: list[Step], console: Console) -> int:
    """``history check --bisect``: the newest regression's step (a recent one first), bisected
    from the commit before it to the commit after it. Exit 1 when the check fails (a recent
    regression) or no commit is named, 2 for the bisection's bad input, else 0."""
    check = 1 if any(st.recent_regression for st in steps) else 0  # the check's own verdict stands
    regressions = [st for st in steps if st.kind == "regression" and st.commit and st.previous_commit
                   and not st.commit.startswith("run ") and not st.previous_commit.startswith("run ")]
    if not regressions:
        console.print("--bisect: no regression with a commit on either side to bisect", highlight=False)
        return check
    # the newest of the recent regressions (those that fail the check), else the newest of all
    st = max(regressions, key=lambda s: (s.recent_regression, s.position, s.config_id))
    console.print(f"--bisect: {st.config_id} ({st.metric}, {describe(st)}) between {st.previous_commit[:12]} and "
                  f"{st.commit[:12]}", highlight=False)
    assert req.bisect is not None
    return max(check, req.bisect(st.previous_commit, st.commit))
