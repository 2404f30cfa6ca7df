"""Load run directories for a report, tolerating what a killed or damaged run leaves behind.

A problem with one run (missing directory, no run.json, truncated or corrupt lines, unknown
schema versions) becomes a warning and the rest of the report is still produced; only when
no run yields anything is it an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gpubench.errors import InputError
from gpubench.results.frame import aggregate, results_frame
from gpubench.results.result import Result
from gpubench.results.store import AB_FILE, RESULTS_FILE, load_results, load_run, read_own


@dataclass
class RunData:
    path: Path
    run_id: str
    meta: dict[str, Any]
    results: list[Result]


@dataclass
class ReportData:
    runs: list[RunData]
    warnings: list[str] = field(default_factory=list)
    frame: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per result
    configs: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per (run, config)
    ab: dict[str, Any] | None = None  # the two sides of one gpubench ab: its verdicts (ab.json) and its id

    @property
    def multi_run(self) -> bool:
        return len(self.runs) > 1


def _load_one(path: Path, notes: list[str]) -> RunData | None:
    if not path.is_dir():
        notes.append(f"{path}: no such run directory; left out of the report")
        return None
    try:
        meta = load_run(path)
    except InputError as e:
        notes.append(f"{e}; the report has no suite or environment context for this run")
        meta = {}
    if not (path / RESULTS_FILE).exists():
        notes.append(f"{path / RESULTS_FILE}: missing; no results from this run")
        return RunData(path, meta.get("run_id", path.name), meta, [])
    try:
        results = load_results(path, strict=False, warn=notes.append)
    except InputError as e:
        notes.append(f"{e}; no results from this run")
        return RunData(path, meta.get("run_id", path.name), meta, [])
    if not results:
        notes.append(f"{path / RESULTS_FILE}: no results (empty file)")
    return RunData(path, meta.get("run_id") or (results[0].run_id if results else path.name), meta, results)


def load_report_data(paths: list[Path]) -> ReportData:
    notes: list[str] = []
    runs = [r for r in (_load_one(p, notes) for p in paths) if r is not None]
    labels = [r.run_id for r in runs]
    if len(set(labels)) < len(labels):  # the same run id twice (e.g. copies): label by path
        for r in runs:
            r.run_id = str(r.path)
    if not any(r.results for r in runs):
        raise InputError("nothing to report: " + ("; ".join(notes) or "no results"))
    ab = _ab_of(runs, notes)
    frames = [results_frame(r.results, run=r.run_id) for r in runs if r.results]
    frame = pd.concat(frames, ignore_index=True)
    return ReportData(runs=runs, warnings=notes, frame=frame, configs=aggregate(frame), ab=ab)


def _ab_of(runs: list[RunData], notes: list[str]) -> dict[str, Any] | None:
    """Where the runs are the two sides of one ``gpubench ab``: each run labelled by its side,
    and the A/B's verdicts (its ab.json, beside the sides) with its id; else None."""
    args = [(r.meta.get("args") or {}) if isinstance(r.meta.get("args"), dict) else {} for r in runs]
    sides = [a.get("ab_side") for a in args]
    ab_ids = {a.get("ab_id") for a in args}
    if sorted(map(str, sides)) != ["baseline", "candidate"] or len(ab_ids) != 1 or \
            len({r.path.resolve().parent for r in runs}) != 1:
        return None
    for r, side in zip(runs, sides):
        r.run_id = str(side)
    path = runs[0].path.resolve().parent / AB_FILE
    try:
        verdicts = json.loads(read_own(path))
    except FileNotFoundError:
        notes.append(f"{path}: missing (an A/B that did not finish); the report shows the two sides without verdicts")
        verdicts = None
    except (OSError, ValueError, RecursionError, InputError) as e:
        notes.append(f"{path}: unreadable ({e}); the report shows the two sides without verdicts")
        verdicts = None
    if verdicts is not None and not (isinstance(verdicts, dict) and isinstance(verdicts.get("verdicts"), list)):
        notes.append(f"{path}: not an A/B's verdicts (no verdicts list); the report shows the two sides without them")
        verdicts = None
    return {"id": next(iter(ab_ids)), "verdicts": verdicts}
