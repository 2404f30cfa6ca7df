"""Reading the history back: the runs it holds and their results as a frame, with filters.
(Writing is gpubench.history.store's.)"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd
import sqlalchemy as sa

from gpubench.history.db import translated_errors
from gpubench.history.schema import machines, results, runs
from gpubench.results.frame import results_frame
from gpubench.results.result import Result


@dataclass(frozen=True)
class Filters:
    suite: str | None = None
    config: str | None = None  # a config id, or a part of one
    machine: str | None = None  # a hostname, or a machine key's prefix
    branch: str | None = None
    since: str | None = None  # an ISO date or time: runs created at or after it

    def where(self) -> list[Any]:
        out: list[Any] = []
        if self.suite:
            out.append(runs.c.suite == self.suite)
        if self.machine:
            out.append(sa.or_(machines.c.hostname == self.machine, machines.c.machine_key.startswith(self.machine)))
        if self.branch:
            out.append(runs.c.branch == self.branch)
        if self.since:
            out.append(runs.c.created_at >= self.since)
        return out


def list_runs(engine: sa.Engine, url: str, f: Filters) -> pd.DataFrame:
    """One row per run, newest first: run, suite, machine, commit, branch, created, complete,
    results (ok of all)."""
    n_ok = sa.func.sum(sa.case((results.c.status == "ok", 1), else_=0))
    q = (sa.select(runs.c.run_id, runs.c.suite, machines.c.hostname, runs.c.git_commit.label("commit"),
                   runs.c.branch, runs.c.created_at, runs.c.complete,
                   sa.func.count(results.c.result_pk).label("results"), n_ok.label("ok"))
         .join(machines, runs.c.machine_pk == machines.c.machine_pk)
         .outerjoin(results, results.c.run_pk == runs.c.run_pk)
         .where(*f.where())
         .group_by(runs.c.run_pk, machines.c.hostname)
         .order_by(runs.c.created_at.desc(), runs.c.run_pk.desc()))
    if f.config:
        q = q.where(runs.c.run_pk.in_(sa.select(results.c.run_pk).where(results.c.config_id.contains(f.config))))
    with translated_errors(url), engine.connect() as conn:
        return pd.DataFrame(conn.execute(q).mappings().all(),
                            columns=["run_id", "suite", "hostname", "commit", "branch", "created_at", "complete",
                                     "results", "ok"])


def load_history(engine: sa.Engine, url: str, f: Filters) -> pd.DataFrame:
    """One row per stored result, as the results frame has it (every registry metric a column),
    with the run's provenance in front: run_id, suite, machine, machine_key, commit, branch,
    commit_time, created_at, complete, ci_url."""
    q = (sa.select(runs.c.run_id.label("h_run"), runs.c.suite, machines.c.hostname.label("machine"),
                   machines.c.machine_key, runs.c.git_commit.label("commit"), runs.c.branch, runs.c.commit_time,
                   runs.c.created_at, runs.c.complete, runs.c.ci_url, results.c.doc)
         .join(machines, runs.c.machine_pk == machines.c.machine_pk)
         .join(results, results.c.run_pk == runs.c.run_pk)
         .where(*f.where())
         .order_by(runs.c.created_at, runs.c.run_pk, results.c.result_pk))
    if f.config:
        q = q.where(results.c.config_id.contains(f.config))
    with translated_errors(url), engine.connect() as conn:
        rows = conn.execute(q).mappings().all()
    if not rows:
        return pd.DataFrame()
    frame = results_frame([Result.from_json(json.loads(r["doc"])) for r in rows])
    prov = pd.DataFrame([{k: v for k, v in r.items() if k != "doc"} for r in rows]).rename(columns={"h_run": "run_id"})
    return pd.concat([prov, frame.drop(columns=[c for c in ("run_id", "run") if c in frame.columns])], axis=1)
