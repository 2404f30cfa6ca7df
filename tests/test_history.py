"""The results history, against a real SQLite file and a real PostgreSQL server (each test
runs on both): recording a run as it goes, ingesting run directories, listing, showing and
exporting, and the errors that must be one line and exit 2."""

from __future__ import annotations

import csv
import re
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, fake_suite, plugin_env, result_lines, run_cli

pytest.importorskip("sqlalchemy")
pytest.importorskip("alembic")

SAMPLES = REPO / "reports" / "samples"
QUICK, FRAMEWORKS = SAMPLES / "cpu-quick-2vcpu" / "run", SAMPLES / "cpu-frameworks-2vcpu" / "run"

FAKE = fake_suite("hist", matrix="mode = [0, 1]")


@pytest.fixture
def gb(tmp_path, capsys, monkeypatch):
    """gpubench's command line in this process (in tmp_path, 200 columns): (exit code, stdout,
    stderr). The history commands spend most of a subprocess's second importing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    from gpubench.cli import main

    def call(args: list[str]) -> subprocess.CompletedProcess:
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)
    return call


def engine_of(db: str):
    from gpubench.history.db import open_engine

    return open_engine(db)


def stored(db: str) -> list[dict]:
    """Every stored result: its run, config, repeat, status and line (ordered)."""
    import sqlalchemy as sa

    from gpubench.history.schema import results, runs

    engine, _ = engine_of(db)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(runs.c.run_id, results.c.config_id, results.c.repeat, results.c.status,
                                      results.c.doc).join(runs, results.c.run_pk == runs.c.run_pk)
                            .order_by(runs.c.run_id, results.c.result_pk)).mappings().all()
    engine.dispose()
    return [{**r, "doc": json.loads(r["doc"])} for r in rows]


def test_ingest_records_every_result_once_and_show_lists_them(tmp_path, history_db, gb):
    proc = gb(["history", "ingest", str(QUICK), str(FRAMEWORKS), "--db", history_db, "--tag", "source=sample"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n_quick, n_frameworks = len(result_lines(QUICK)), len(result_lines(FRAMEWORKS))
    assert f"{QUICK}: {n_quick} result(s) added, 0 already in the history" in proc.stdout
    assert f"{FRAMEWORKS}: {n_frameworks} result(s) added, 0 already" in proc.stdout
    again = gb(["history", "ingest", str(QUICK), "--db", history_db])
    assert again.returncode == 0 and f"0 result(s) added, {n_quick} already in the history" in again.stdout

    rows = stored(history_db)
    assert len(rows) == n_quick + n_frameworks  # nothing twice
    by_key = {(r["run_id"], r["config_id"], r["repeat"]): r for r in rows}
    for line in result_lines(QUICK):  # each stored line is the result line, whole
        row = by_key[(line["run_id"], line["config_id"], line["repeat"])]
        assert row["status"] == line["status"] and row["doc"] == line

    listed = gb(["history", "list", "--db", history_db])
    assert listed.returncode == 0, listed.stderr
    assert "2 run(s)" in listed.stdout and "quick-20261124-104622" in listed.stdout
    ok = sum(1 for line in result_lines(QUICK) if line["status"] == "ok")
    assert f"{ok}/{n_quick}" in listed.stdout
    only = gb(["history", "list", "--db", history_db, "--suite", "frameworks"])
    assert "1 run(s)" in only.stdout and "quick-2026" not in only.stdout

    shown = gb(["history", "show", "--db", history_db, "--config", "cnn-torch-cpu-bs64-fp32",
                     "--metric", "throughput"])
    assert shown.returncode == 0, shown.stderr
    (line,) = [x for x in result_lines(QUICK) if x["config_id"] == "cnn-torch-cpu-bs64-fp32-single"]
    assert f"{line['metrics']['throughput']['median']:.1f}" in shown.stdout


def test_export_writes_one_row_per_result_with_provenance(tmp_path, history_db, gb):
    assert gb(["history", "ingest", str(QUICK), "--db", history_db]).returncode == 0
    proc = gb(["history", "export", "--db", history_db, "--out", "h.csv", "--suite", "quick"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "h.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    lines = {x["config_id"]: x for x in result_lines(QUICK)}
    assert len(rows) == len(lines)
    meta = json.loads((QUICK / "run.json").read_text())
    for row in rows:
        line = lines[row["config_id"]]
        assert row["run_id"] == line["run_id"] and row["status"] == line["status"]
        assert row["commit"] == meta["env"]["git"]["commit"] and row["machine"] == meta["env"]["hostname"]
        if line["status"] == "ok":
            assert float(row["throughput"]) == pytest.approx(line["metrics"]["throughput"]["median"])
    pq = gb(["history", "export", "--db", history_db, "--out", "h.parquet", "--suite", "quick"])
    assert pq.returncode == 0, pq.stdout + pq.stderr
    import pandas as pd

    parquet = pd.read_parquet(tmp_path / "h.parquet")
    assert sorted(parquet["config_id"]) == sorted(lines) and set(parquet["commit"]) == {meta["env"]["git"]["commit"]}
    bad = gb(["history", "export", "--db", history_db, "--out", "h.txt"])
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and ".csv or .parquet" in bad.stderr


def test_run_with_db_records_each_result_its_provenance_and_tags(tmp_path, write_suite, history_db, gb):
    suite = write_suite(FAKE)
    env = plugin_env(GITHUB_SHA="0123456789abcdef0123456789abcdef01234567", GITHUB_REF_NAME="main",
                     GITHUB_REPOSITORY="acme/models", GITHUB_RUN_ID="42", GITHUB_SERVER_URL="https://github.com")
    proc = run_cli(["run", str(suite), "--out", "runs", "--no-report", "--no-calibrate", "--db", history_db,
                    "--tag", "runner=ci-1"],
                   cwd=tmp_path, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # mode 1 raises: an error result, exit 1
    (run_dir,) = list((tmp_path / "runs").iterdir())
    lines = result_lines(run_dir)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["provenance"]["commit"] == "0123456789abcdef0123456789abcdef01234567"
    assert meta["provenance"]["ci_url"] == "https://github.com/acme/models/actions/runs/42"
    assert meta["tags"] == {"runner": "ci-1"}
    rows = stored(history_db)
    assert [(r["config_id"], r["status"]) for r in rows] == [(x["config_id"], x["status"]) for x in lines]
    assert [r["doc"] for r in rows] == lines

    import sqlalchemy as sa

    from gpubench.history.schema import results, runs

    engine, _ = engine_of(history_db)
    with engine.connect() as conn:
        run = conn.execute(sa.select(runs)).mappings().one()
        figures = [json.loads(f) for f in conn.execute(sa.select(results.c.figures)).scalars()]
        throughput = [f["throughput"] for f in figures if "throughput" in f]
    engine.dispose()
    assert run["complete"] is True and run["branch"] == "main" and run["tags"] == {"runner": "ci-1"}
    assert run["git_commit"] == meta["provenance"]["commit"] and run["ci_url"] == meta["provenance"]["ci_url"]
    (ok,) = [x for x in lines if x["status"] == "ok"]
    assert throughput == [pytest.approx(ok["metrics"]["throughput"]["median"])]
    # ingesting the same run directory afterwards adds nothing
    again = gb(["history", "ingest", str(run_dir), "--db", history_db])
    assert f"0 result(s) added, {len(lines)} already" in again.stdout


def test_a_run_stopped_midway_keeps_its_results_marked_incomplete(tmp_path, history_db, gb):
    """A run whose process ended before its end (no finish): the results recorded so far stay,
    and the run is listed as incomplete; ingesting its finished directory later completes it."""
    from gpubench.history.store import Recorder
    from gpubench.results.store import load_results, load_run

    engine, url = engine_of(history_db)
    meta = {**load_run(QUICK), "completed": False, "finished_at": None}
    first = load_results(QUICK)[:3]
    rec = Recorder(engine, url, meta)
    rec.begin()
    assert all(rec.record(r) for r in first)
    engine.dispose()
    listed = gb(["history", "list", "--db", history_db])
    row = next(line for line in listed.stdout.splitlines() if "quick-20261124-104622" in line)
    assert " no " in row and f"/{len(first)}" in row
    assert gb(["history", "ingest", str(QUICK), "--db", history_db]).returncode == 0
    listed = gb(["history", "list", "--db", history_db])
    row = next(line for line in listed.stdout.splitlines() if "quick-20261124-104622" in line)
    assert " yes " in row and f"/{len(result_lines(QUICK))}" in row


def test_two_writers_at_once_lose_nothing_and_add_nothing_twice(tmp_path, history_db):
    """Two processes ingesting at the same moment, each both sample runs, in opposite order:
    every result once, none lost."""
    engine_of(history_db)[0].dispose()  # the schema exists before the race (creating it is tested apart)
    cmds = [[sys.executable, "-m", "gpubench", "history", "ingest", *map(str, dirs), "--db", history_db]
            for dirs in ((QUICK, FRAMEWORKS), (FRAMEWORKS, QUICK))]
    procs = [subprocess.Popen(c, cwd=tmp_path, env=plugin_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for c in cmds]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    rows = stored(history_db)
    assert len(rows) == len(result_lines(QUICK)) + len(result_lines(FRAMEWORKS))
    assert len({(r["run_id"], r["config_id"], r["repeat"]) for r in rows}) == len(rows)


def test_a_new_database_created_by_two_processes_at_once(tmp_path, history_db):
    cmd = [sys.executable, "-m", "gpubench", "history", "list", "--db", history_db]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=plugin_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs


def test_the_migrations_build_the_schema_the_code_declares(history_db):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from gpubench.history.schema import metadata

    engine, _ = engine_of(history_db)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    assert diff == []


def test_a_database_of_a_newer_schema_is_refused_in_one_line(tmp_path, write_suite, history_db, gb):
    import sqlalchemy as sa

    engine, _ = engine_of(history_db)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    proc = gb(["history", "list", "--db", history_db])
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "schema revision 9999 was written by a newer gpubench" in line and "upgrade gpubench" in line
    proc = run_cli(["run", str(write_suite(FAKE)), "--db", history_db, "--out", "runs", "--no-report", "--no-calibrate"], cwd=tmp_path)
    assert proc.returncode == 2 and "was written by a newer gpubench" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("kind", ["not-a-database", "unreachable-server", "directory"])
def test_an_unusable_database_is_one_line_and_exit_2_before_anything_runs(tmp_path, write_suite, kind):
    if kind == "not-a-database":
        db = tmp_path / "garbage.db"
        db.write_bytes(b"this is not a SQLite file, it is plain text" * 100)
        db = str(db)
    elif kind == "directory":
        (tmp_path / "adir").mkdir()
        db = str(tmp_path / "adir")
    else:  # nothing listens on port 1
        db = "postgresql://nobody@127.0.0.1:1/nothing"
        pytest.importorskip("psycopg")
    suite = write_suite(FAKE)
    for args in (["history", "list", "--db", db], ["run", str(suite), "--out", "runs", "--no-report", "--no-calibrate", "--db", db]):
        proc = run_cli(args, cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("gpubench: error: history database") and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()  # no run directory, nothing trained


def test_bad_tags_and_metrics_are_one_line(tmp_path, gb):
    for args, text in ((["history", "ingest", str(QUICK), "--tag", "novalue"], "expected KEY=VALUE"),
                       (["history", "show", "--metric", "speed"], "--metric speed: unknown metric")):
        proc = gb([*args, "--db", str(tmp_path / "h.db")])
        assert proc.returncode == 2 and text in proc.stderr, proc.stderr


def test_a_lock_held_past_the_timeout_is_one_line(tmp_path, gb, history_db, monkeypatch):
    """Another writer holds the lock (SQLite: a write transaction; PostgreSQL: an exclusive lock
    on the runs table) for longer than the timeout: the ingest gives up with one line, exit 2,
    and once the lock is gone the same ingest succeeds."""
    import sqlalchemy as sa

    import gpubench.history.db as db

    engine, _ = engine_of(history_db)  # the schema exists
    monkeypatch.setattr(db, "LOCK_TIMEOUT_S", 0.5)
    with engine.connect() as holder:
        if engine.dialect.name == "postgresql":
            holder.execute(sa.text("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE"))
        else:
            holder.execute(sa.text("INSERT INTO machines (machine_key, hostname, cpu_model, first_seen) "
                                   "VALUES ('held', 'h', 'c', 'now')"))
        proc = gb(["history", "ingest", str(QUICK), "--db", history_db])
        # a run recording into it: refused at the start, and no run directory is left behind (a
        # built-in workload: the fake backend's plugin would stay registered in this process)
        (tmp_path / "s.toml").write_text('[defaults]\nframework = "torch"\nworkload = "mlp"\nsteps = 2\n')
        ran = gb(["run", "s.toml", "--out", "runs", "--no-report", "--no-calibrate", "--db", history_db])
        holder.rollback()
    engine.dispose()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpubench: error: history database") and ("locked" in line or "lock timeout" in line)
    assert ran.returncode == 2 and "history database" in ran.stderr, ran.stdout + ran.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    proc = gb(["history", "ingest", str(QUICK), "--db", history_db])
    assert proc.returncode == 0 and f"{len(result_lines(QUICK))} result(s) added" in proc.stdout


def commit_runs(root: Path, factors: list[float], machine: str = "vm", name: str = "quick", noise: float = 0.0,
                seed: int = 0) -> list[Path]:
    """Copies of the quick sample's run, one per commit in order, on ``machine``: commit i's
    throughputs (median and CI bounds) are the sample's times ``factors[i]``, and with ``noise``
    each config's times its own lognormal draw of that spread (seeded)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    meta = json.loads((QUICK / "run.json").read_text())
    lines = result_lines(QUICK)
    dirs = []
    for i, factor in enumerate(factors):
        run_id = f"{name}-{machine}-{i:03d}"
        d = root / run_id
        d.mkdir(parents=True)
        when = f"2026-11-{10 + i:02d}T12:00:00+00:00"
        env = {**meta["env"], "hostname": machine}
        (d / "run.json").write_text(json.dumps({
            **meta, "run_id": run_id, "created_at": when, "env": env, "tags": {},
            "provenance": {"commit": f"{i:02d}" + "c" * 38, "branch": "main", "commit_time": when, "ci_url": None,
                           "source": "ci"}}))
        out = []
        for line in lines:
            line = {**line, "run_id": run_id, "env": env}
            if line["status"] == "ok":
                t = line["metrics"]["throughput"]
                f = factor * (float(np.exp(rng.normal(0.0, noise))) if noise else 1.0)
                line["metrics"] = {**line["metrics"], "throughput": {k: v * f for k, v in t.items()}}
            out.append(json.dumps(line))
        (d / "results.jsonl").write_text("\n".join(out) + "\n")
        dirs.append(d)
    return dirs


@pytest.mark.slow
def test_the_dashboard_charts_each_config_over_the_commits_per_machine(tmp_path, gb, history_db):
    factors_a, factors_b = [1.0, 1.10, 0.90, 0.95], [0.5, 0.5, 0.55]
    dirs = commit_runs(tmp_path / "a", factors_a, "host-a") + commit_runs(tmp_path / "b", factors_b, "host-b")
    assert gb(["history", "ingest", *dirs, "--db", history_db]).returncode == 0
    pin = "mlp_depth2_width512-torch-cpu-bs256-fp32-single"
    proc = gb(["history", "report", "--db", history_db, "--out", "dash", "--pin", pin])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = (tmp_path / "dash" / "index.html").read_text()
    # a metric without CI bounds in the registry (step_ms): its band is the range at each commit
    both = gb(["history", "report", "--db", history_db, "--out", "dash-step", "--metric", "throughput",
               "--metric", "step_ms"])
    assert both.returncode == 0, both.stdout + both.stderr
    assert len(re.findall(r'data-file="quick/[^"]+-step_ms.png"', (tmp_path / "dash-step" / "index.html").read_text())
               ) == len([x for x in result_lines(QUICK) if x["status"] == "ok"])
    ok = [x for x in result_lines(QUICK) if x["status"] == "ok"]
    # one chart per ok config and metric (throughput; mfu where a result has it, as these CPU
    # results with a calibrated peak do; no tensor-core counters on a CPU), embedded and also
    # written as a file
    from gpubench.results.metrics import BY_NAME
    from gpubench.results.store import load_results

    with_mfu = {r.config_id for r in load_results(QUICK) if r.ok and BY_NAME["mfu"].value(r) is not None}
    assert with_mfu
    charts = re.findall(r'data-file="([^"]+)"', page)
    assert sorted(charts) == sorted([f"quick/{x['config_id']}-throughput.png" for x in ok]
                                    + [f"quick/{c}-mfu.png" for c in with_mfu])
    assert all((tmp_path / "dash" / "charts" / c).stat().st_size > 1000 for c in charts)
    assert charts[0] == f"quick/{pin}-throughput.png"  # pinned first
    assert "4 commit(s)" in page and "host-a, host-b" in page
    # the table: latest vs previous vs best, per config and machine
    (line,) = [x for x in ok if x["config_id"] == pin]
    base = line["metrics"]["throughput"]["median"]
    from gpubench import fmt

    rows = re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td><td>throughput</td><td>(.*?)</td><td>(.*?)</td>"
                      r"<td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td>(\d+)</td></tr>", page)
    assert len(rows) == 2 * len(ok)
    a = next(r for r in rows if pin in r[0] and r[1] == "host-a")
    assert a[2] == f"{fmt.rate(base * 0.95)} @ 03cccccc" and a[3] == f"{fmt.rate(base * 0.90)} @ 02cccccc"
    assert a[4] == f"{100 * (0.95 / 0.90 - 1):+.1f}%" and a[5] == f"{fmt.rate(base * 1.10)} @ 01cccccc"
    assert a[6] == f"{100 * (0.95 / 1.10 - 1):+.1f}%" and a[7] == "4"
    b = next(r for r in rows if pin in r[0] and r[1] == "host-b")
    assert b[2] == f"{fmt.rate(base * 0.55)} @ 02cccccc" and b[7] == "3"
    # filters reach the dashboard; an unknown pin is a warning, not an error
    proc = gb(["history", "report", "--db", history_db, "--out", "dash2", "--machine", "host-b", "--pin", "nope"])
    assert proc.returncode == 0 and "--pin nope: no ok result of that config" in proc.stderr
    assert "host-a" not in (tmp_path / "dash2" / "index.html").read_text()


def test_a_run_killed_midway_keeps_its_finished_results_marked_incomplete(tmp_path, write_suite, history_db):
    """A real run stopped by SIGTERM while its second config hangs: the first result is in
    results.jsonl and in the history, and the history lists the run as incomplete."""
    import signal
    import time

    import sqlalchemy as sa

    from gpubench.history.schema import results, runs

    suite = write_suite(FAKE.replace("mode = [0, 1]", "mode = [0, 2]").replace("timeout_s = 20", "timeout_s = 120"))
    proc = subprocess.Popen([sys.executable, "-m", "gpubench", "run", str(suite), "--out", "runs", "--no-report",
                             "--no-calibrate", "--db", history_db], cwd=tmp_path, env=plugin_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    engine, _ = engine_of(history_db)
    try:
        deadline = time.monotonic() + 60
        n = 0
        while time.monotonic() < deadline and n < 1:
            time.sleep(0.3)
            with engine.connect() as conn:
                n = conn.execute(sa.select(sa.func.count()).select_from(results)).scalar_one()
        assert n == 1, "the first result never reached the history"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, out + err
        with engine.connect() as conn:
            run = conn.execute(sa.select(runs.c.complete, runs.c.finished_at)).one()
        assert tuple(run) == (False, None)
    finally:
        if proc.poll() is None:
            proc.kill()
        engine.dispose()
    (run_dir,) = list((tmp_path / "runs").iterdir())
    assert [r["doc"] for r in stored(history_db)] == result_lines(run_dir)
    assert "the history (the run marked incomplete)" in err


@pytest.mark.parametrize("missing", ["sqlalchemy", "alembic"])
def test_without_the_history_extra_the_commands_say_what_to_install(tmp_path, write_suite, missing):
    """gpubench's core install has no SQLAlchemy or Alembic: the history commands and run --db
    say what to install in one line, exit 2, before anything runs."""
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / f"{missing}.py").write_text(f"raise ImportError('No module named {missing}')\n")
    env = plugin_env()
    env["PYTHONPATH"] = os.pathsep.join([str(blocked), env["PYTHONPATH"]])
    for args in (["history", "list", "--db", "h.db"],
                 ["run", str(write_suite(FAKE)), "--out", "runs", "--no-report", "--db", "h.db"]):
        proc = run_cli(args, cwd=tmp_path, env=env)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert "needs SQLAlchemy and Alembic" in line and "pip install 'sqlalchemy>=2.0' 'alembic>=1.12'" in line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "h.db").exists()


def test_a_parallel_ingest_records_what_a_sequential_one_does(tmp_path, history_db, monkeypatch):
    """Enough run directories for worker processes to read and write them, each directory a
    share of its own so that both workers write at once: every result once, each directory
    reported in order, the same stored lines as ingesting them one by one."""
    from gpubench.history import store
    from gpubench.history.store import PARALLEL_MIN_RUNS, ingest_runs

    monkeypatch.setattr(store, "BATCH_BYTES", 1)
    dirs = commit_runs(tmp_path / "runs", [1.0 + i / 100 for i in range(PARALLEL_MIN_RUNS)])
    assert len(list(store._shares(dirs))) == len(dirs)
    engine, url = engine_of(history_db)
    reported = list(ingest_runs(engine, url, dirs, workers=2))
    again = list(ingest_runs(engine, url, dirs, workers=2))
    engine.dispose()
    n = len(result_lines(QUICK))
    assert reported == [(d, n, 0) for d in dirs] and again == [(d, 0, n) for d in dirs]
    rows = stored(history_db)
    assert [r["doc"] for r in rows] == [line for d in dirs for line in result_lines(d)]


def test_gpubench_db_in_the_environment_records_every_run(tmp_path, write_suite):
    """GPUBENCH_DB names the history for every run without --db."""
    db = tmp_path / "env-history.db"
    proc = run_cli(["run", str(write_suite(FAKE)), "--out", "runs", "--no-report", "--no-calibrate"], cwd=tmp_path,
                   env=plugin_env(GPUBENCH_DB=str(db)))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # mode 1's error result
    (run_dir,) = list((tmp_path / "runs").iterdir())
    assert [r["doc"] for r in stored(str(db))] == result_lines(run_dir)


def test_figures_are_the_registrys_values(tmp_path):
    """The figures an ingest stores are what Metric.value gives for every numeric metric, on
    the committed samples' lines and on lines missing what some metrics read."""
    from gpubench.history.store import figures
    from gpubench.results.metrics import METRICS
    from gpubench.results.result import Result

    lines = [x for d in (QUICK, FRAMEWORKS) for x in result_lines(d)]
    sparse = {**lines[0], "metrics": {**lines[0]["metrics"], "memory": None, "mfu": 7.0, "throughput": {
        "median": 10, "ci_low": float("inf"), "ci_high": 12.0}}, "model": None}
    for line in [*lines, sparse]:
        r = Result.from_json(line)
        expected = {m.name: float(v) for m in METRICS for v in [m.value(r)]
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        assert figures(r) == expected
        assert len(expected) >= 25 or line is sparse or line["status"] != "ok"  # most of the registry
    assert "mfu" not in figures(Result.from_json(sparse)) and "throughput_ci_low" not in figures(
        Result.from_json(sparse))


def test_postgresql_stores_result_lines_with_lz4(postgres):
    """The second migration compresses the stored lines with lz4 on a server that has it (the
    tests' server is Debian's, built with lz4), and a database at the first revision is
    brought to it when opened."""
    import sqlalchemy as sa
    from alembic import command

    from gpubench.history.db import _alembic_config, head_revision, make_engine

    url = postgres.create_database("lz4_migration")
    engine = make_engine(url)
    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0001")
    compression = sa.text("SELECT attcompression FROM pg_attribute WHERE attrelid = 'results'::regclass "
                          "AND attname = 'doc'")
    with engine.connect() as conn:
        assert conn.execute(compression).scalar_one() == ""  # the server's default (pglz)
    engine.dispose()
    engine, _ = engine_of(url)
    with engine.connect() as conn:
        assert conn.execute(compression).scalar_one() == "l"
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == head_revision()
    engine.dispose()


def test_check_finds_the_commit_where_each_series_stepped(tmp_path, gb, history_db):
    """Fifteen commits, the throughput of every config 10% lower from the eleventh: one step
    per config at that commit, sized -10%, a regression among the newest commits (exit 1); the
    dashboard lists and marks the same steps."""
    dirs = commit_runs(tmp_path / "runs", [1.0] * 10 + [0.9] * 5)
    assert gb(["history", "ingest", *dirs, "--db", history_db]).returncode == 0
    ok = sorted(x["config_id"] for x in result_lines(QUICK) if x["status"] == "ok")
    proc = gb(["history", "check", "--db", history_db, "--json", "steps.json"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REGRESSION in the newest commits" in proc.stdout and "09cccccc -> 10cccccc" in proc.stdout
    steps = json.loads((tmp_path / "steps.json").read_text())["steps"]
    assert sorted(s["config_id"] for s in steps) == ok
    for s in steps:
        assert s["commit"] == "10" + "c" * 38 and s["kind"] == "regression" and s["recent_regression"]
        assert s["ratio"] == pytest.approx(0.9) and s["p_value"] <= 0.01 and s["from_end"] == 5
    # older than the newest 4 commits: listed, but the check passes
    assert gb(["history", "check", "--db", history_db, "--recent", "4"]).returncode == 0
    page_proc = gb(["history", "report", "--db", history_db, "--out", "dash"])
    assert page_proc.returncode == 0, page_proc.stderr
    page = (tmp_path / "dash" / "index.html").read_text()
    assert "<h3>Change points</h3>" in page and page.count("<td>09cccccc -&gt; 10cccccc</td>") == len(ok)  # escaped
    assert "None found" not in page and "too short to search" not in page
    plain = gb(["history", "report", "--db", history_db, "--out", "plain", "--no-changes", "--config", ok[0]])
    assert plain.returncode == 0 and "Change points" not in (tmp_path / "plain" / "index.html").read_text()


def test_check_finds_a_large_step_in_ten_commits_despite_a_stalled_run(tmp_path, gb, history_db):
    """Ten commits, the run of the third stalled (3% of the throughput), 40% slower from the
    eighth: the stall is left out, the step is found at its commit by the t-test of a short
    split, and the check fails."""
    dirs = commit_runs(tmp_path / "runs", [1.0, 1.0, 0.03, 1.0, 1.0, 1.0, 1.0, 0.6, 0.6, 0.6])
    assert gb(["history", "ingest", *dirs, "--db", history_db]).returncode == 0
    proc = gb(["history", "check", "--db", history_db, "--json", "steps.json"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "06cccccc -> 07cccccc" in proc.stdout
    steps = json.loads((tmp_path / "steps.json").read_text())["steps"]
    assert steps and all(s["commit"] == "07" + "c" * 38 and s["kind"] == "regression" and s["test"] == "t"
                         and s["ratio"] == pytest.approx(0.6) for s in steps)
    # --together with one config left by the filter: that config is searched alone, as above
    one = steps[0]["config_id"]
    proc = gb(["history", "check", "--db", history_db, "--together", "--config", one, "--json", "one.json"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (step,) = json.loads((tmp_path / "one.json").read_text())["steps"]
    assert step["test"] == "t" and step["commit"] == "07" + "c" * 38


def test_configs_searched_together_find_a_small_step_that_each_alone_mostly_misses(tmp_path, gb, history_db):
    """30 commits of the quick sample's 12 ok configs, each config's throughput with its own 3%
    noise, all 3% slower from commit 20: searched alone, most configs show no step (it is no
    larger than their noise); searched together (``--together``), every config's step is at
    commit 20, sized on its own series, and the check fails (``--recent 10``)."""
    dirs = commit_runs(tmp_path / "runs", [1.0] * 20 + [0.97] * 10, noise=0.03, seed=4)
    ok = sorted(x["config_id"] for x in result_lines(QUICK) if x["status"] == "ok")
    # one more config, retired after commit 15: searched alone, it must not cost the others
    # the commits it lacks (it is not measured at the newest one)
    retired = json.loads((QUICK / "results.jsonl").read_text().splitlines()[0])
    retired = {**retired, "config_id": "retired-config"}
    for d in dirs[:16]:
        line = json.loads((d / "results.jsonl").read_text().splitlines()[0])
        line = {**line, "config_id": "retired-config", "config_hash": "retired"}
        with (d / "results.jsonl").open("a") as f:
            f.write(json.dumps(line) + "\n")
    assert gb(["history", "ingest", *dirs, "--db", history_db]).returncode == 0
    alone = gb(["history", "check", "--db", history_db, "--json", "alone.json"])
    found_alone = {s["config_id"] for s in json.loads((tmp_path / "alone.json").read_text())["steps"]
                   if s["commit"] == "20" + "c" * 38}
    assert len(found_alone) < len(ok) // 2, (found_alone, alone.stdout)
    proc = gb(["history", "check", "--db", history_db, "--together", "--recent", "10", "--json", "together.json"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "searched together" in proc.stdout and "19cccccc -> 20cccccc" in proc.stdout
    steps = [s for s in json.loads((tmp_path / "together.json").read_text())["steps"]
             if s["config_id"] != "retired-config"]
    assert sorted(s["config_id"] for s in steps) == ok
    assert all(s["commit"] == "20" + "c" * 38 and s["points"] == 30 and s["from_end"] == 10 and s["test"] == "together" and s["p_value"] <= 0.01 for s in steps)
    assert 0.9 < sorted(s["ratio"] for s in steps)[len(steps) // 2] < 1.0  # the median config's size: about -3%


def test_check_improvements_short_series_and_bad_input(tmp_path, gb, history_db):
    dirs = commit_runs(tmp_path / "up", [1.0] * 10 + [1.2] * 4, machine="up")
    dirs += commit_runs(tmp_path / "short", [1.0, 0.5, 0.5], machine="short")
    assert gb(["history", "ingest", *dirs, "--db", history_db]).returncode == 0
    proc = gb(["history", "check", "--db", history_db, "--json", "s.json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr  # an improvement does not fail the check
    steps = json.loads((tmp_path / "s.json").read_text())["steps"]
    assert steps and {s["kind"] for s in steps} == {"improvement"} and {s["machine"] for s in steps} == {"up"}
    assert "series too short to test (fewer than 6 commits)" in proc.stdout
    # a smaller threshold than the step: still an improvement; a larger one: small
    proc = gb(["history", "check", "--db", history_db, "--threshold", "25%", "--json", "t.json"])
    assert {s["kind"] for s in json.loads((tmp_path / "t.json").read_text())["steps"]} == {"small"}
    for args, message in ((["--p-value", "2"], "--p-value 2: must be between 0 and 1"),
                          (["--permutations", "10"], "--permutations 10: at --p-value 0.01 needs at least 99"),
                          (["--min-size", "1"], "--min-size 1: must be at least 2"),
                          (["--recent", "0"], "--recent 0: must be at least 1"),
                          (["--last", "4"], "--last 4: must be 0 (every commit) or at least 6 (twice --min-size)"),
                          (["--threshold", "x"], "--threshold x: expected a percentage"),
                          (["--suite", "nope"], "no ok results for these filters; nothing to check")):
        proc = gb(["history", "check", "--db", history_db, *args])
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1


def test_noise_is_the_spread_within_commits_and_gives_the_detectable_slowdown(tmp_path, gb, history_db):
    """Two runs of each of four commits, the second 2% faster: the noise is the pooled spread
    of the log throughput within commits (log(1.02) / sqrt(2)), and the gate's minimal
    detectable slowdown and repeats follow from it."""
    dirs = commit_runs(tmp_path / "a", [1.0, 1.5, 0.8, 1.0]) + commit_runs(tmp_path / "b", [1.02, 1.53, 0.816, 1.02],
                                                                           name="again")
    assert gb(["history", "ingest", *dirs, "--db", history_db]).returncode == 0
    proc = gb(["history", "noise", "--db", history_db, "--json", "noise.json", "--effect", "5%"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    levels = json.loads((tmp_path / "noise.json").read_text())["noise"]
    ok = [x for x in result_lines(QUICK) if x["status"] == "ok"]
    assert sorted(n["config_id"] for n in levels) == sorted(x["config_id"] for x in ok)
    for n in levels:
        assert n["sigma"] == pytest.approx(math.log(1.02) / math.sqrt(2), rel=1e-6)
        assert (n["results"], n["commits"]) == (8, 4)
        assert 0.03 < n["detectable"] < 0.05 and 5 <= n["repeats_for_effect"] <= 10
    assert "with 10 repeats a side, a slowdown of" in proc.stdout and "or more is caught 95% of the time" in proc.stdout
    for args, message in ((["--repeats", "1"], "--repeats 1: must be at least 2"),
                          (["--effect", "lots"], "--effect lots: expected a percentage"),
                          (["--noise-floor", "5%"], "--noise-floor 5% is above --threshold 3%")):
        proc = gb(["history", "noise", "--db", history_db, *args])
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)


def test_the_dashboard_charts_the_tensor_core_counter_where_results_have_it(tmp_path, gb):
    """With no --metric, a result with NVML's tensor-core activity adds its chart (and mfu's);
    a change in a counter with no direction would be a "change", never a regression."""
    dirs = commit_runs(tmp_path / "a", [1.0, 1.0])
    pin = "mlp_depth2_width512-torch-cpu-bs256-fp32-single"
    for i, d in enumerate(dirs):
        lines = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines()]
        for line in lines:
            if line["config_id"] == pin:
                line["telemetry"] = {**(line.get("telemetry") or {}), "gpu": {"tensor_active_pct_mean": 40.0 + i}}
        (d / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    db = f"sqlite:///{tmp_path / 'h.db'}"
    assert gb(["history", "ingest", *dirs, "--db", db]).returncode == 0
    proc = gb(["history", "report", "--db", db, "--out", "dash", "--config", "mlp_depth2"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    charts = re.findall(r'data-file="([^"]+)"', (tmp_path / "dash" / "index.html").read_text())
    assert f"quick/{pin}-tensor_active_pct.png" in charts and f"quick/{pin}-throughput.png" in charts
    assert sum(c.endswith("-tensor_active_pct.png") for c in charts) == 1  # the one config that has it
    named = gb(["history", "report", "--db", db, "--out", "dash2", "--config", "mlp_depth2", "--metric", "step_ms"])
    assert named.returncode == 0
    assert all(c.endswith("-step_ms.png") for c in re.findall(r'data-file="([^"]+)"',
                                                              (tmp_path / "dash2" / "index.html").read_text()))
    from gpubench.history.changes import kind_of

    assert kind_of(1.2, "sm_occupancy_pct", 0.03) == "change" and kind_of(0.8, "tensor_active_pct", 0.03) == "regression"


def test_check_bisect_hands_the_newest_regressions_commits_to_bisect(tmp_path, gb):
    """history check --bisect: the commits on either side of the step go to gpubench bisect (here a
    directory that is no git repository, so bisect refuses them: exit 2, naming the repository)."""
    dirs = commit_runs(tmp_path / "a", [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 0.70, 0.71, 0.69, 0.70, 0.72, 0.7, 0.71])
    db = f"sqlite:///{tmp_path / 'h.db'}"
    assert gb(["history", "ingest", *dirs, "--db", db]).returncode == 0
    (tmp_path / "notgit").mkdir()
    proc = gb(["history", "check", "--db", db, "--config", "mlp_depth2_width512-torch-cpu-bs256-fp32",
               "--bisect", "s.toml", "--repo", str(tmp_path / "notgit")])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "between 06cccccccccc and 07cccccccccc" in proc.stdout
    assert "not a git repository" in proc.stderr
    calm = commit_runs(tmp_path / "b", [1.0, 1.01, 0.99, 1.0, 1.01, 0.99], name="calm")
    db2 = f"sqlite:///{tmp_path / 'h2.db'}"
    assert gb(["history", "ingest", *calm, "--db", db2]).returncode == 0
    quiet = gb(["history", "check", "--db", db2, "--bisect", "s.toml", "--repo", str(tmp_path / "notgit")])
    assert quiet.returncode == 0 and "no regression with a commit on either side to bisect" in quiet.stdout
