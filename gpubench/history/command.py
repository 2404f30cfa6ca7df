"""``gpubench history ingest | list | show | export``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from gpubench import fmt
from gpubench.errors import InputError, warn
from gpubench.history.dashboard import DEFAULT_METRICS, build_dashboard
from gpubench.history.db import display_url, open_engine
from gpubench.history.query import Filters, list_runs, load_history
from gpubench.history.store import ingest_runs
from gpubench.results.metrics import BY_NAME
from gpubench.results.outputs import check_output_dir

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
    metrics = (_check_metrics(req.metrics) if req.action == "show" else
               _check_metrics(req.metrics or list(DEFAULT_METRICS)) if req.action == "report" else [])
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
            return 0
        if req.action == "list":
            frame = list_runs(engine, url, req.filters)
            table = Table(title=f"runs in {display_url(url)}")
            for col in ("run", "suite", "machine", "commit", "branch", "created", "complete", "results ok/all"):
                table.add_column(col)
            for r in frame.itertuples():
                table.add_row(r.run_id, r.suite, r.hostname, _cell(r.commit)[:12], _cell(r.branch), r.created_at,
                              "yes" if r.complete else "no", f"{int(r.ok or 0)}/{int(r.results)}")
            console.print(table)
            console.print(f"{len(frame)} run(s)", highlight=False)
            return 0
        if req.action == "report":
            assert req.out is not None
            dash = build_dashboard(engine, url, req.out, req.filters, metrics, req.pinned)
            for w in dash.warnings:
                warn(w)
            console.print(f"dashboard: {dash.index} ({dash.charts} charts)", highlight=False)
            return 0
        frame = load_history(engine, url, req.filters)
        if req.action == "export":
            assert out is not None
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            if out.suffix == ".parquet":
                _write_parquet(frame, tmp)
            else:
                frame.to_csv(tmp, index=False)
            tmp.replace(out)
            console.print(f"{len(frame)} result(s) -> {out}", highlight=False)
            return 0
        table = Table(title=f"results in {display_url(url)}")
        for col in ("run", "commit", "machine", "config", "repeat", "status", *metrics):
            table.add_column(col)
        for _, r in frame.iterrows():
            figures = [fmt.metric(BY_NAME[m].kind, r.get(m)) if r["status"] == "ok" else "" for m in metrics]
            table.add_row(r["run_id"], _cell(r["commit"])[:12], r["machine"], r["config_id"], str(r["repeat"]),
                          r["status"], *figures)
        console.print(table)
        console.print(f"{len(frame)} result(s)", highlight=False)
        return 0
    finally:
        engine.dispose()
