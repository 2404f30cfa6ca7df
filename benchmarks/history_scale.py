"""Scale of the results history: ingesting many results, and (with --dashboard) building the
trend dashboard over a long history.

What it measures, wall time with ``time.perf_counter``:

- **ingest**: ``--runs`` run directories of ``--configs`` results each (default 1,000 x 100 =
  100,000 results), made in a temporary directory from the committed sample result lines
  (each config a sample line with its id suffixed and its throughput and step time scaled
  by a seeded log-normal factor; each run its own commit), recorded by the code path of
  ``gpubench history ingest`` (gpubench.history.store.ingest_runs, one engine) into a fresh
  database; the time includes reading and parsing the run directories;
- **dashboard** (with ``--dashboard``): ``gpubench history report`` (build_dashboard) over
  that database.

Target (issue: results history): 100,000 results into SQLite within 10 s on the 2-core
development VM; a dashboard over 1,000 commits x 50 configs within 30 s; the same on
PostgreSQL (``--db postgresql://...``, an empty database).

    PYTHONPATH=. python benchmarks/history_scale.py [--runs 1000] [--configs 100] [--db URL]
        [--dashboard] [--profile] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

import numpy as np  # noqa: E402

SAMPLES = HERE.parent / "reports" / "samples"
SOURCES = [SAMPLES / "cpu-quick-2vcpu" / "run", SAMPLES / "cpu-frameworks-2vcpu" / "run"]


def templates() -> tuple[dict, list[dict]]:
    """(run.json of the quick sample, every ok result line of the samples)."""
    meta = json.loads((SOURCES[0] / "run.json").read_text())
    lines = [json.loads(x) for src in SOURCES for x in (src / "results.jsonl").read_text().splitlines() if x.strip()]
    return meta, [x for x in lines if x["status"] == "ok"]


def make_runs(root: Path, n_runs: int, n_configs: int, seed: int = 0) -> list[Path]:
    meta, lines = templates()
    rng = np.random.default_rng(seed)
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    dirs = []
    for i in range(n_runs):
        run_id = f"scale-{i:05d}"
        created = (start + timedelta(minutes=10 * i)).isoformat(timespec="seconds")
        commit = hashlib.sha1(str(i).encode()).hexdigest()
        m = {**meta, "run_id": run_id, "created_at": created, "finished_at": created, "completed": True,
             "provenance": {"commit": commit, "branch": "main", "commit_time": created, "ci_url": None,
                            "source": "ci"}, "tags": {}}
        d = root / run_id
        d.mkdir()
        (d / "run.json").write_text(json.dumps(m))
        out = []
        factors = rng.lognormal(0.0, 0.03, n_configs)
        for k in range(n_configs):
            line = copy.deepcopy(lines[k % len(lines)])
            line["run_id"], line["config_id"] = run_id, f"{line['config_id']}-v{k // len(lines)}"
            met = line["metrics"]
            met["throughput"] = {key: v * factors[k] for key, v in met["throughput"].items()}
            met["step_time_ms"] = {key: (v / factors[k] if key not in ("n", "cv") else v)
                                   for key, v in met["step_time_ms"].items()}
            out.append(json.dumps(line))
        (d / "results.jsonl").write_text("\n".join(out) + "\n")
        dirs.append(d)
    return dirs


@contextlib.contextmanager
def second_postgres_db(url: str) -> Iterator[str]:
    """A new database on the server of ``url`` (dropped afterwards), for the profile's writes."""
    import sqlalchemy as sa

    name = f"gpubench_profile_{os.getpid()}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield sa.engine.make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE {name}")
        admin.dispose()


def profile(dirs: list[Path], db: str) -> dict[str, float]:
    """Microseconds per result of each step of an ingest, in this process (see the docstring)."""
    from gpubench.history.db import open_engine
    from gpubench.history.store import _result_row, _write_parsed, figures
    from gpubench.results.result import Result
    from gpubench.results.store import decode_line, load_run

    spent = dict.fromkeys(("read and decode", "shape check", "registry figures", "row", "write"), 0.0)
    parsed, n = [], 0
    for d in dirs:
        t0 = time.perf_counter()
        objs = [(line, decode_line(line)) for line in (d / "results.jsonl").read_bytes().splitlines() if line]
        t1 = time.perf_counter()
        found = [(line.decode(), Result.from_json(obj)) for line, obj in objs]
        t2 = time.perf_counter()
        for _, r in found:
            figures(r)
        t3 = time.perf_counter()
        rows = [_result_row(0, r, line) for line, r in found]  # takes the figures again: less t3 - t2
        t4 = time.perf_counter()
        spent["read and decode"] += t1 - t0
        spent["shape check"] += t2 - t1
        spent["registry figures"] += t3 - t2
        spent["row"] += (t4 - t3) - (t3 - t2)
        parsed.append((load_run(d), rows))
        n += len(rows)
    engine, url = open_engine(db)
    t0 = time.perf_counter()
    batch: list[tuple[dict, list[dict]]] = []
    for i, (meta, rows) in enumerate(parsed, start=1):
        batch.append((meta, rows))
        if sum(len(r) for _, r in batch) >= 2000 or i == len(parsed):
            with engine.begin() as conn:  # as a parallel ingest's worker writes its share
                for m, r in batch:
                    _write_parsed(conn, engine, url, m, r, None)
            batch = []
    spent["write"] = time.perf_counter() - t0
    engine.dispose()
    return {k: v / n * 1e6 for k, v in spent.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--configs", type=int, default=100)
    p.add_argument("--db", help="an empty database (default: a SQLite file in a temporary directory)")
    p.add_argument("--dashboard", action="store_true", help="also time the dashboard over the database")
    p.add_argument("--workers", type=int, help="processes reading the run directories (default: the CPUs; 1: "
                                               "this process only)")
    p.add_argument("--profile", action="store_true", help="also print where an ingest's time goes, per result, in "
                                                          "one process")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)

    from gpubench.history.db import display_url, open_engine
    from gpubench.history.store import ingest_runs

    with tempfile.TemporaryDirectory(prefix="gpubench-scale-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        dirs = make_runs(root / "runs" if (root / "runs").mkdir() is None else root, a.runs, a.configs)
        made = time.perf_counter() - t0
        engine, url = open_engine(a.db or str(root / "history.db"))
        t0 = time.perf_counter()
        added = sum(n for _, n, _ in ingest_runs(engine, url, dirs, workers=a.workers))
        ingest_s = time.perf_counter() - t0
        figures = {"db": display_url(url), "runs": a.runs, "configs": a.configs, "results": added,
                   "make_s": made, "ingest_s": ingest_s, "results_per_s": added / ingest_s}
        print(f"made {a.runs} run directories x {a.configs} results in {made:.1f} s")
        print(f"ingest: {added} results in {ingest_s:.2f} s ({added / ingest_s:,.0f} results/s) "
              f"into {display_url(url)}")
        if a.dashboard:
            from gpubench.history.dashboard import build_dashboard

            t0 = time.perf_counter()
            dash = build_dashboard(engine, url, root / "dashboard")
            figures["dashboard_s"] = time.perf_counter() - t0
            figures["dashboard_charts"] = dash.charts
            print(f"dashboard: {dash.charts} charts in {figures['dashboard_s']:.2f} s -> {dash.index}")
        engine.dispose()
        if a.profile:
            if a.db and a.db.startswith("postgresql"):
                with second_postgres_db(a.db) as other:
                    split = profile(dirs, other)
            else:
                split = profile(dirs, str(root / "profile.db"))
            figures["profile_us_per_result"] = split
            print("profile (one process, microseconds per result): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in split.items()) + f"; total {sum(split.values()):.0f}")
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
