"""Writing runs and results into the history (reading them back is gpubench.history.query's).

A run is written as it goes: ``Recorder.begin`` (the machine and the run, marked incomplete),
``record`` for each result as it finishes (one transaction each, so a killed run keeps what
it finished), ``finish`` (complete). ``ingest`` does the same for a run directory already on
disk. Both are idempotent: a run is identified by run_key (below) and a result by (run,
config id, repeat), so recording a run live and ingesting its directory later, or ingesting
it twice, adds it once.

A run's key is run.json's ``run_uuid`` (random, made with the run); a run.json from before it
has a hash of its host, run id and creation time instead, which two runs of one suite started
in the same second on one host share. So a collision never drops rows silently: a result whose
(run, config id, repeat) the history has with a different result line is refused (a
HistoryError naming the run and the config, exit 2) and nothing of that run is written; only a
result recorded again as it was is skipped. The one exception is a repeat the run itself ran
again (``--resume --retry-failed``): its error or timeout row is replaced by the new result when
the run is keyed by its run_uuid (no other run has it) or the run directory's superseded.jsonl
holds the stored line.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import multiprocessing
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from gpubench.errors import InputError
from gpubench.history.db import HistoryError, display_url, translated_errors
from gpubench.history.schema import machines, results, runs
from gpubench.provenance import commit_time
from gpubench.results.metrics import METRICS
from gpubench.results.result import Result, ResultError
from gpubench.results.store import (
    RESULTS_FILE,
    RETRIED_STATUSES,
    load_run,
    read_results,
    result_line,
    run_env,
    superseded_lines,
)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _insert(conn: sa.Connection, table: sa.Table) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING, in the connection's dialect."""
    from sqlalchemy.dialects import postgresql, sqlite

    if conn.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()


def machine_row(env: dict[str, Any]) -> dict[str, Any]:
    """The machine's identity from an environment fingerprint: machine_key hashes the host, CPU
    model and GPU UUIDs (what an upgrade of drivers or frameworks leaves alone)."""
    gpus = [g for g in env.get("gpus") or [] if isinstance(g, dict)]
    uuids = sorted(str(g.get("uuid")) for g in gpus if g.get("uuid"))
    hostname, cpu = str(env.get("hostname") or "unknown"), str(env.get("cpu_model") or "unknown")
    key = hashlib.sha1("\n".join([hostname, cpu, *uuids]).encode()).hexdigest()
    models = sorted({str(g.get("name")) for g in gpus if g.get("name")})
    drivers = sorted({str(g.get("driver")) for g in gpus if g.get("driver")})
    return {"machine_key": key, "hostname": hostname, "cpu_model": cpu,
            "gpu_model": ", ".join(models) or None, "gpu_uuids": ",".join(uuids) or None,
            "driver": ", ".join(drivers) or None}


def run_key(meta: dict[str, Any], env: dict[str, Any]) -> str:
    """The run's identity in the history: run.json's ``run_uuid`` as 32 hex digits (unique from
    the run's creation); a run.json from before run_uuid: the SHA-1 of its host, run id and
    creation time (40 hex digits, so never equal to a uuid's key), which runs of one suite
    started in the same second on one host share."""
    value = meta.get("run_uuid")
    if value is not None:
        try:
            return uuid.UUID(str(value)).hex
        except ValueError:
            raise HistoryError(f"run {meta.get('run_id')}: run.json's run_uuid {value!r} is not a UUID "
                               "(32 hex digits)") from None
    text = f"{env.get('hostname')}\n{meta.get('run_id')}\n{meta.get('created_at')}"
    return hashlib.sha1(text.encode()).hexdigest()


def run_digest(meta: dict[str, Any]) -> str:
    """A hash of what run.json says of the run when it is made (its suite, args, creation time
    and tags; not what changes as it goes: completion, resumes, a Slurm run's fingerprint), the
    same whether the run is recorded live or ingested later."""
    fixed = {k: meta.get(k) for k in ("suite", "args", "created_at", "tags")}
    return hashlib.sha1(json.dumps(fixed, sort_keys=True, default=str).encode()).hexdigest()


def _normalised(doc: str) -> Any:
    """A stored result line as the JSON object gpubench would write for it (a line written by
    another version or re-encoded may differ in spacing, key order or defaults only)."""
    obj = json.loads(doc)
    try:
        return json.loads(result_line(Result.from_json(obj)))
    except ResultError:
        return obj


def same_result(stored: str, new: str) -> bool:
    """Whether two result lines are the same result (the text first: the usual case)."""
    if stored == new:
        return True
    try:
        return bool(_normalised(stored) == _normalised(new))
    except ValueError:  # not JSON: only the same text is the same
        return False


def _tree(paths: list[tuple[str, tuple[str, ...]]]) -> dict[str, Any]:
    """Metric names by path, as nested {key: (name or None, {key: ...})}: a line's objects are
    walked once for all the metrics inside them."""
    tree: dict[str, Any] = {}
    for name, path in paths:
        node = tree
        for i, key in enumerate(path):
            leaf, children = node.get(key, (None, {}))
            node[key] = (name if i == len(path) - 1 else leaf, children)
            node = children
    return tree


# the registry's metrics found at a path, and those computed (flags and labels left out: they
# are never numbers); a test checks that figures() gives what Metric.value gives
_AT_PATH = _tree([(m.name, m.path) for m in METRICS if m.path and m.kind not in ("flag", "text")])
_DERIVED = tuple(m for m in METRICS if m.derive is not None and m.kind not in ("flag", "text"))


def _collect(obj: dict[str, Any], tree: dict[str, Any], out: dict[str, float]) -> None:
    for key, (name, children) in tree.items():
        v = obj.get(key)
        if name is not None and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[name] = float(v)
        if children and isinstance(v, dict):
            _collect(v, children, out)


def figures(result: Result) -> dict[str, float]:
    """Every finite numeric figure of the metric registry in ``result`` (flags and labels stay
    in the stored result line): ``Metric.value`` of each metric, with each object of the line
    walked once, since an ingest takes them from every result line it reads."""
    out: dict[str, float] = {}
    for block, (_, children) in _AT_PATH.items():
        v = getattr(result, block)
        if isinstance(v, dict):
            _collect(v, children, out)
    for m in _DERIVED:
        v = m.value(result)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[m.name] = float(v)
    return out


def _result_row(run_pk: int, r: Result, line: str | None = None) -> dict[str, Any]:
    """A result as a row of the results table (``line``: as results.jsonl has it, else made)."""
    c = r.config
    batch = c.get("batch_size")
    return {"run_pk": run_pk, "config_id": r.config_id, "config_hash": r.config_hash, "repeat": r.repeat,
            "status": r.status, "reason": r.reason, "workload": c.get("workload"), "framework": c.get("framework"),
            "device": c.get("device"), "precision": c.get("precision"),
            "batch_size": batch if isinstance(batch, int) and not isinstance(batch, bool) else None,
            "figures": _encode(figures(r)), "doc": line if line is not None else result_line(r)}


try:  # orjson where installed (the history extra): an ingest encodes every result's figures
    import orjson

    def _encode(obj: dict[str, float]) -> str:
        return orjson.dumps(obj).decode()
except ImportError:  # pragma: no cover - depends on the environment
    def _encode(obj: dict[str, float]) -> str:
        return json.dumps(obj)


def _suite_name(meta: dict[str, Any]) -> str:
    suite = meta.get("suite")
    return str(suite.get("name") or "unnamed") if isinstance(suite, dict) else "unnamed"


@dataclass
class Recorder:
    """Records one run into the history. ``begin`` before any training (it is the first
    write, so a database that cannot be written fails the run before it starts)."""

    engine: sa.Engine
    url: str
    meta: dict[str, Any]  # the run.json object
    tags: dict[str, str] = field(default_factory=dict)
    run_pk: int | None = None
    source: str | None = None  # where the run is read from (its directory), for messages
    superseded: tuple[str, ...] = ()  # result lines the run replaced (its superseded.jsonl)

    def begin(self, results_so_far: Sequence[Result] = ()) -> bool:
        """Write the machine and the run (incomplete), and any results it already has (a resumed
        run), in one transaction. True when the run was new to the history."""
        if not self.meta.get("env") and results_so_far:
            self.meta = {**self.meta, "env": run_env(self.meta, list(results_so_far))}
        with translated_errors(self.url), self.engine.begin() as conn:
            new = self.write_run(conn)
            self.insert_rows(conn, [_result_row(0, r) for r in results_so_far])
        return new

    def _where(self) -> str:
        return self.source or f"run {self.meta.get('run_id')}"

    def write_run(self, conn: sa.Connection, machine_ids: dict[str, int] | None = None) -> bool:
        """The machine and the run, in ``conn``'s transaction; sets run_pk. True when the run
        was new to the history. ``machine_ids``: machine keys already written in this
        transaction, with their ids (a batch of runs from one machine writes it once)."""
        env = self.meta.get("env") or {}
        prov = self.meta.get("provenance") or {}
        git = env.get("git") or {}
        if not prov and git.get("commit"):  # a run from before provenance: gpubench's own commit
            prov = {"commit": git["commit"], "commit_time": commit_time(git["commit"])}
        run_id, created = str(self.meta.get("run_id")), str(self.meta.get("created_at"))
        key, digest = run_key(self.meta, env), run_digest(self.meta)
        machine = machine_row(env)
        machine_pk = (machine_ids or {}).get(machine["machine_key"])
        if machine_pk is None:
            conn.execute(_insert(conn, machines).values(**machine, first_seen=_now()))
            machine_pk = conn.execute(sa.select(machines.c.machine_pk).where(
                machines.c.machine_key == machine["machine_key"])).scalar_one()
            if machine_ids is not None:
                machine_ids[machine["machine_key"]] = machine_pk
        pk = conn.execute(_insert(conn, runs).values(
            run_key=key, run_id=run_id, suite=_suite_name(self.meta), machine_pk=machine_pk, created_at=created,
            finished_at=self.meta.get("finished_at"), complete=bool(self.meta.get("completed")),
            git_commit=prov.get("commit") or git.get("commit"), branch=prov.get("branch"),
            commit_time=prov.get("commit_time"), ci_url=prov.get("ci_url"),
            tags={**(self.meta.get("tags") or {}), **self.tags}, env=env, recorded_at=_now(), run_digest=digest,
        ).returning(runs.c.run_pk)).scalar_one_or_none()  # no row: the history has the run
        new = pk is not None
        if pk is None:
            pk, had_id, had_digest = conn.execute(sa.select(runs.c.run_pk, runs.c.run_id, runs.c.run_digest).where(
                runs.c.run_key == key)).one()
            if had_id != run_id:  # a run directory copied and renamed, run.json and all
                raise HistoryError(f"{self._where()}: its run_uuid is already in the history "
                                   f"{display_url(self.url)} as run {had_id}: two runs with the same run key; "
                                   "this run was not recorded")
            if had_digest is not None and had_digest != digest:  # another run of the same name, host and second
                raise HistoryError(f"{self._where()}: another run with the same key (run {had_id}: the same host, "
                                   "suite and second, and no run_uuid in run.json, which gpubench writes since "
                                   f"0.1) is in the history {display_url(self.url)} with other settings or tags; "
                                   "this run was not recorded")
            if had_digest is None:  # recorded before run_digest: from now on it has one
                conn.execute(runs.update().where(runs.c.run_pk == pk).values(run_digest=digest))
        self.run_pk = pk
        if not new and self.meta.get("completed"):  # recorded while it ran, complete since
            conn.execute(runs.update().where(runs.c.run_pk == self.run_pk).values(
                complete=True, finished_at=self.meta.get("finished_at")))
        return new

    def record(self, result: Result) -> bool:
        """One result, in a transaction of its own; False when the history has it already."""
        assert self.run_pk is not None, "begin() first"
        with translated_errors(self.url), self.engine.begin() as conn:
            return self.insert_rows(conn, [_result_row(self.run_pk, result)]) == 1

    def insert_rows(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> int:
        """Result rows (``_result_row``) into this run, in ``conn``'s transaction; returns how
        many were new. A row the history has with the same result line is skipped; with a
        different one it is a HistoryError (the caller's transaction then rolls back, so none
        of the run's rows is written)."""
        assert self.run_pk is not None, "write_run() first"
        if not rows:
            return 0
        rows = [{**row, "run_pk": self.run_pk} for row in rows]
        insert = _insert(conn, results)
        if conn.dialect.name == "sqlite":  # its driver sums the rows each insert added
            added = int(conn.execute(insert, rows).rowcount)
        else:
            # writers of one run take turns (a live recorder and an ingest of its directory), so that
            # the count below sees only this transaction's rows
            conn.execute(sa.select(runs.c.run_pk).where(runs.c.run_pk == self.run_pk).with_for_update())
            count = sa.select(sa.func.count()).select_from(results).where(results.c.run_pk == self.run_pk)
            before = conn.execute(count).scalar_one()
            conn.execute(insert, rows)
            added = int(conn.execute(count).scalar_one() - before)
        if added < len(rows):
            added += self._reconcile(conn, rows)
        return added

    def _reconcile(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> int:
        """The rows ON CONFLICT DO NOTHING skipped, checked against what the history holds: the
        same result is fine; an error or timeout row the run ran again is replaced (returns how
        many); any other difference is another run with this run's key, whose rows would be
        dropped without a word: a HistoryError naming the run, the config and the repeat."""
        q = (sa.select(results.c.config_id, results.c.repeat, results.c.status, results.c.doc)
             .where(results.c.run_pk == self.run_pk))
        stored = {(c, r): (status, doc) for c, r, status, doc in conn.execute(q)}
        replaced = 0
        for row in rows:
            key = (row["config_id"], row["repeat"])
            if key not in stored or same_result(stored[key][1], row["doc"]):
                continue
            status, doc = stored[key]
            if status in RETRIED_STATUSES and (self.meta.get("run_uuid") is not None
                                           or any(same_result(doc, line) for line in self.superseded)):
                conn.execute(results.update().where(results.c.run_pk == self.run_pk, results.c.config_id == key[0],
                                                    results.c.repeat == key[1])
                             .values({k: v for k, v in row.items() if k not in ("run_pk", "config_id", "repeat")}))
                stored[key] = (row["status"], row["doc"])
                replaced += 1
                continue
            raise HistoryError(
                f"{self._where()}: {key[0]} repeat {key[1]} is already in the history {display_url(self.url)} "
                "with a different result: two runs with the same run key (a legacy run.json without run_uuid? "
                "runs of one suite started in the same second on one host); this run was not recorded")
        return replaced

    def finish(self, finished_at: str | None = None) -> None:
        assert self.run_pk is not None, "begin() first"
        with translated_errors(self.url), self.engine.begin() as conn:
            conn.execute(runs.update().where(runs.c.run_pk == self.run_pk).values(
                complete=True, finished_at=finished_at or _now()))


def parsed_run(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]], tuple[str, ...]]:
    """A run directory read for the history: its run.json (with the fingerprint of its first
    result where run.json has none), its results as rows of the results table, each with its
    line as written, and the lines it superseded (``--retry-failed``). The expensive half of
    an ingest (decoding, checking and taking the figures out of every line): a parallel ingest
    runs it in worker processes."""
    meta = load_run(run_dir)
    found = read_results(run_dir)
    if not meta.get("env") and found:
        meta = {**meta, "env": run_env(meta, [r for _, r in found])}
    try:
        superseded = superseded_lines(run_dir)
    except InputError as e:
        raise HistoryError(str(e)) from None
    return meta, [_result_row(0, r, line) for line, r in found], superseded


def _write_parsed(conn: sa.Connection, engine: sa.Engine, url: str, meta: dict[str, Any], rows: list[dict[str, Any]],
                  tags: dict[str, str] | None, machine_ids: dict[str, int] | None = None,
                  source: str | None = None, superseded: tuple[str, ...] = ()) -> tuple[int, int]:
    """A parsed run, in ``conn``'s transaction: (results added, results the history had).
    ``machine_ids``: as ``Recorder.write_run`` takes it; ``source`` and ``superseded``: the
    run directory and the lines it superseded (``parsed_run``)."""
    rec = Recorder(engine, url, meta, tags or {}, source=source, superseded=superseded)
    rec.write_run(conn, machine_ids)
    added = rec.insert_rows(conn, rows)
    return added, len(rows) - added


def ingest(engine: sa.Engine, url: str, run_dir: Path, tags: dict[str, str] | None = None) -> tuple[int, int]:
    """Record a run directory, in one transaction: (results added, results the history had already)."""
    meta, rows, superseded = parsed_run(run_dir)
    with translated_errors(url), engine.begin() as conn:
        return _write_parsed(conn, engine, url, meta, rows, tags, source=str(run_dir), superseded=superseded)


PARALLEL_MIN_RUNS = 8  # fewer run directories are ingested in this process: starting workers costs more
BATCH_BYTES = 8 << 20  # a parallel ingest writes whole runs in transactions of about this much result text


def ingest_runs(engine: sa.Engine, url: str, run_dirs: Sequence[Path], tags: dict[str, str] | None = None,
                workers: int | None = None) -> Iterator[tuple[Path, int, int]]:
    """Record run directories, yielding (run dir, added, had) for each, in order. With several
    CPUs and at least PARALLEL_MIN_RUNS directories, worker processes each read a share of the
    directories and write it, whole runs in transactions of about BATCH_BYTES of results.jsonl
    (a commit per run costs more than the run's rows on SQLite); the database orders the
    writers (SQLite: each transaction begun IMMEDIATE waits for the lock)."""
    from gpubench.env import usable_cores  # psutil, which nothing else of the history needs

    workers = workers if workers is not None else usable_cores()
    if workers < 2 or len(run_dirs) < PARALLEL_MIN_RUNS:
        for d in run_dirs:
            yield (d, *ingest(engine, url, d, tags))
        return
    # spawn: the workers start clean, without this process's database connections
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            for done in pool.map(_ingest_share, itertools.repeat(url), _shares(run_dirs), itertools.repeat(tags)):
                yield from done
        except BaseException:  # the shares not started yet are cancelled (those already running still finish)
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _shares(run_dirs: Sequence[Path]) -> Iterator[list[Path]]:
    """The run directories in consecutive shares of about BATCH_BYTES of results.jsonl each."""
    share: list[Path] = []
    size = 0
    for d in run_dirs:
        share.append(d)
        try:
            size += (d / RESULTS_FILE).stat().st_size
        except OSError:
            pass  # reading it will say what is wrong
        if size >= BATCH_BYTES:
            yield share
            share, size = [], 0
    if share:
        yield share


_ENGINES: dict[str, sa.Engine] = {}  # a worker's engine for each database it writes


def _ingest_share(url: str, run_dirs: list[Path], tags: dict[str, str] | None) -> list[tuple[Path, int, int]]:
    """A worker's share of a parallel ingest: read every directory, then write them all in one
    transaction (the database is migrated already: the caller opened it)."""
    from gpubench.history.db import make_engine

    engine = _ENGINES.get(url) or _ENGINES.setdefault(url, make_engine(url))
    parsed = [(d, *parsed_run(d)) for d in run_dirs]
    machine_ids: dict[str, int] = {}
    with translated_errors(url), engine.begin() as conn:
        return [(d, *_write_parsed(conn, engine, url, meta, rows, tags, machine_ids, str(d), superseded))
                for d, meta, rows, superseded in parsed]
