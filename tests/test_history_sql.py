"""The history's identities and its schema as plain SQL reads it, against a real SQLite file and
a real PostgreSQL server (each test on both): runs started at the same moment keep every row,
a collision of run keys is refused instead of merged, the schema's column names join
naturally (migration 0003, upgraded with data in it), the SQL of docs/history.md returns what
the data says, and a --db URL that cannot be read is one line."""

# ruff: noqa: F811 - the tests take the imported fixture gb as an argument

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, plugin_env, result_lines, run_cli

# gb is test_history's fixture (the command line in this process), which the tests take by name
from tests.test_history import FAKE, FRAMEWORKS, QUICK, commit_runs, engine_of, gb, stored  # noqa: F401

pytest.importorskip("sqlalchemy")
pytest.importorskip("alembic")

CONFIG = "mlp_depth2_width512-torch-cpu-bs256-fp32-single"  # the config of the docs' throughput query


def count(db: str, table: str) -> int:
    import sqlalchemy as sa

    engine, _ = engine_of(db)
    with engine.connect() as conn:
        n = conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one()
    engine.dispose()
    return int(n)


def legacy_copy(dest: Path, factor: float = 1.0, status: str | None = None, **meta_changes) -> Path:
    """The quick sample's run directory (a run.json from before run_uuid) copied to ``dest``:
    its throughputs times ``factor``; ``status``: the first ok result's status instead."""
    dest.mkdir(parents=True)
    meta = {**json.loads((QUICK / "run.json").read_text()), **meta_changes}
    assert "run_uuid" not in json.loads((QUICK / "run.json").read_text())
    (dest / "run.json").write_text(json.dumps(meta))
    out, changed = [], False
    for line in result_lines(QUICK):
        if line["status"] == "ok":
            t = line["metrics"]["throughput"]
            line = {**line, "metrics": {**line["metrics"], "throughput": {k: v * factor for k, v in t.items()}}}
            if status and not changed:
                line, changed = {**line, "status": status, "reason": "RuntimeError: boom", "metrics": {}}, True
        out.append(json.dumps(line))
    (dest / "results.jsonl").write_text("\n".join(out) + "\n")
    return dest


# --- a run's identity -------------------------------------------------------------------------

BARRIER = """
import os, time
at = float(os.environ.get("GB_BARRIER_AT", "0"))
if time.time() < at:
    time.sleep(at - time.time())
"""


@pytest.mark.slow
def test_four_runs_started_at_once_keep_every_row(tmp_path, history_db, gb):
    """Four `gpubench run` processes of one suite, each into its own --out (CI matrix jobs on
    one runner) and all into one database, released at the same moment (a plugin that waits
    for the start of a common second, so their run directories are made within it): four
    runs, every row of every run, each run's own tags; ingesting the four directories again
    adds nothing."""
    (tmp_path / "gb_barrier.py").write_text(BARRIER)
    suite = tmp_path / "s.toml"
    suite.write_text(FAKE)
    at = math.ceil(time.time()) + 4
    env = plugin_env(GB_BARRIER_AT=str(at), GPUBENCH_PLUGINS="tests.plugins.fake,gb_barrier")
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{tmp_path}"
    procs = [subprocess.Popen([sys.executable, "-m", "gpubench", "run", str(suite), "--out", f"runs-{i}",
                               "--repeats", "2", "--no-report", "--no-calibrate", "--db", history_db,
                               "--tag", f"job={i}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [1] * 4, outs  # mode 1 raises: an error result, exit 1
    dirs = [d for i in range(4) for d in (tmp_path / f"runs-{i}").iterdir()]
    assert len(dirs) == 4
    metas = [json.loads((d / "run.json").read_text()) for d in dirs]
    lines = {m["run_id"]: result_lines(d) for m, d in zip(metas, dirs)}
    assert len(lines) == 4 and len({m["run_uuid"] for m in metas}) == 4
    assert all(len(v) == 4 for v in lines.values())  # 2 configs x 2 repeats

    rows = stored(history_db)
    assert len(rows) == sum(len(v) for v in lines.values()) == count(history_db, "results")
    assert count(history_db, "runs") == 4
    for run_id, expected in lines.items():
        assert sorted(json.dumps(r["doc"], sort_keys=True) for r in rows if r["run_id"] == run_id) == sorted(
            json.dumps(x, sort_keys=True) for x in expected)
    import sqlalchemy as sa

    from gpubench.history.schema import runs

    engine, _ = engine_of(history_db)
    with engine.connect() as conn:
        tags = {run_id: t for run_id, t in conn.execute(sa.select(runs.c.run_id, runs.c.tags))}
        keys = set(conn.execute(sa.select(runs.c.run_key)).scalars())
    engine.dispose()
    assert {m["run_id"]: {"job": m["tags"]["job"]} for m in metas} == tags
    assert keys == {m["run_uuid"] for m in metas}
    again = gb(["history", "ingest", *dirs, "--db", history_db])
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("0 result(s) added, 4 already in the history") == 4
    assert count(history_db, "results") == len(rows) and count(history_db, "runs") == 4


def test_a_legacy_key_collision_is_refused_not_merged(tmp_path, history_db, gb, monkeypatch):
    """Two run directories whose run.json has no run_uuid and the same host, run id and creation
    time, with different results: the second is refused (one line, exit 2) by `history
    ingest`, by a parallel ingest's workers and by the live recorder, and nothing of it is
    written."""
    from gpubench.history import store
    from gpubench.history.db import HistoryError
    from gpubench.history.store import PARALLEL_MIN_RUNS, Recorder, ingest_runs
    from gpubench.results.store import load_results, load_run

    first, second = legacy_copy(tmp_path / "a" / "run"), legacy_copy(tmp_path / "b" / "run", factor=1.5)
    assert gb(["history", "ingest", first, "--db", history_db]).returncode == 0
    want = result_lines(first)

    def unchanged() -> None:
        assert [r["doc"] for r in stored(history_db)] == want and count(history_db, "runs") == 1

    proc = gb(["history", "ingest", second, "--db", history_db])
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"gpubench: error: {second}: cnn-torch-cpu-bs64-fp32-single repeat 0 is already in the "
                           "history") and "with a different result: two runs with the same run key" in line
    assert "run.json without run_uuid" in line
    unchanged()

    # the parallel path: worker processes, each directory a share (transaction) of its own
    monkeypatch.setattr(store, "BATCH_BYTES", 1)
    others = commit_runs(tmp_path / "others", [1.0] * PARALLEL_MIN_RUNS, machine="other")
    engine, url = engine_of(history_db)
    with pytest.raises(HistoryError, match=re.escape(f"{second}: cnn-torch-cpu-bs64-fp32-single repeat 0")):
        list(ingest_runs(engine, url, [*others[:4], second, *others[4:]], workers=2))
    import sqlalchemy as sa

    from gpubench.history.schema import results, runs

    with engine.connect() as conn:  # the colliding run kept its first rows only
        docs = conn.execute(sa.select(results.c.doc).join(runs, runs.c.run_pk == results.c.run_pk)
                            .where(runs.c.run_id == want[0]["run_id"]).order_by(results.c.result_pk)).scalars()
        assert [json.loads(d) for d in docs] == want

    # the live recorder: at its start (the results a resumed run has) and for a new result
    meta = load_run(second)
    with pytest.raises(HistoryError, match=f"run {meta['run_id']}: .* with a different result"):
        Recorder(engine, url, meta).begin(load_results(second))
    rec = Recorder(engine, url, meta)
    rec.begin()
    with pytest.raises(HistoryError, match="with a different result"):
        rec.record(load_results(second)[0])
    assert rec.record(load_results(first)[0]) is False  # the same result again: nothing added, fine
    with engine.connect() as conn:
        docs = conn.execute(sa.select(results.c.doc).join(runs, runs.c.run_pk == results.c.run_pk)
                            .where(runs.c.run_id == want[0]["run_id"]).order_by(results.c.result_pk)).scalars()
        assert [json.loads(d) for d in docs] == want
    engine.dispose()


def test_a_copied_run_directory_under_another_name_is_refused(tmp_path, history_db, gb):
    """Two directories with one run_uuid but different run ids (a run directory copied, run.json
    and all, and renamed): the second is refused, not merged into the first."""
    uuid = "0123456789abcdef" * 2
    a = legacy_copy(tmp_path / "a", run_id="quick-a", run_uuid=uuid)
    b = legacy_copy(tmp_path / "b", run_id="quick-b", run_uuid=uuid.upper())  # the same UUID, written otherwise
    assert gb(["history", "ingest", a, "--db", history_db]).returncode == 0
    proc = gb(["history", "ingest", b, "--db", history_db])
    assert proc.returncode == 2 and f"{b}: its run_uuid is already in the history" in proc.stderr
    assert "as run quick-a" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    bad = legacy_copy(tmp_path / "c", run_id="quick-c", run_uuid="not-a-uuid")
    proc = gb(["history", "ingest", bad, "--db", history_db])
    assert proc.returncode == 2 and "run_uuid 'not-a-uuid' is not a UUID" in proc.stderr
    assert count(history_db, "runs") == 1


def test_a_retried_repeat_replaces_its_error_row_and_nothing_else(tmp_path, history_db, gb):
    """`run --resume --retry-failed` runs an error repeat again (the old line moved to
    superseded.jsonl): the history's error row is replaced by the new result, for a run keyed
    by its run_uuid (live) and for a legacy run whose superseded.jsonl holds the stored line
    (ingest); a legacy run without that proof is refused."""
    from gpubench.history.store import Recorder
    from gpubench.results.store import load_results, load_run
    failed = legacy_copy(tmp_path / "failed", status="error", run_uuid="ab" * 16, run_id="uuid-run")
    retried = legacy_copy(tmp_path / "retried", run_uuid="ab" * 16, run_id="uuid-run")
    engine, url = engine_of(history_db)
    Recorder(engine, url, load_run(failed)).begin(load_results(failed))
    rec = Recorder(engine, url, load_run(retried))
    assert rec.begin(load_results(retried)[1:]) is False  # the resumed run: the rows it had, unchanged
    assert rec.record(load_results(retried)[0]) is True  # the repeat it ran again
    engine.dispose()
    assert [r["doc"] for r in stored(history_db)] == result_lines(retried)

    # legacy: ingested failed, then again after the retry with the proof in superseded.jsonl
    legacy = legacy_copy(tmp_path / "legacy", status="error")
    assert gb(["history", "ingest", legacy, "--db", history_db]).returncode == 0
    error_line = (legacy / "results.jsonl").read_text().splitlines()[0]
    other = legacy_copy(tmp_path / "other")  # the same key, an ok result there, no superseded.jsonl
    proc = gb(["history", "ingest", other, "--db", history_db])
    assert proc.returncode == 2 and "with a different result" in proc.stderr
    shutil.copy(other / "results.jsonl", legacy / "results.jsonl")
    (legacy / "superseded.jsonl").write_text(error_line + "\n")
    proc = gb(["history", "ingest", legacy, "--db", history_db])
    assert proc.returncode == 0 and f"1 result(s) added, {len(result_lines(legacy)) - 1} already" in proc.stdout
    rows = [r for r in stored(history_db) if r["run_id"] == result_lines(legacy)[0]["run_id"]]
    assert [r["doc"] for r in rows] == result_lines(legacy) and rows[0]["status"] == "ok"


# --- the schema as plain SQL reads it --------------------------------------------------------

def test_the_tables_share_only_their_keys(tmp_path, history_db, gb):
    """No column name but the key is shared between two tables, so NATURAL JOIN joins on the
    keys alone: all of the sample's results come back joined to their runs and machines."""
    import sqlalchemy as sa

    assert gb(["history", "ingest", QUICK, FRAMEWORKS, "--db", history_db]).returncode == 0
    engine, _ = engine_of(history_db)
    columns = {t: {c["name"] for c in sa.inspect(engine).get_columns(t)} for t in ("machines", "runs", "results")}
    assert columns["machines"] & columns["runs"] == {"machine_pk"}
    assert columns["runs"] & columns["results"] == {"run_pk"}
    assert columns["machines"] & columns["results"] == set()
    assert "commit" not in columns["runs"] and "git_commit" in columns["runs"] and "run_id" in columns["runs"]
    with engine.connect() as conn:
        n = conn.execute(sa.text("SELECT COUNT(*) FROM machines NATURAL JOIN runs NATURAL JOIN results")).scalar_one()
        ids = set(conn.execute(sa.text("SELECT DISTINCT run_id FROM runs NATURAL JOIN results")).scalars())
    engine.dispose()
    assert n == len(result_lines(QUICK)) + len(result_lines(FRAMEWORKS))
    assert ids == {result_lines(QUICK)[0]["run_id"], result_lines(FRAMEWORKS)[0]["run_id"]}


def test_an_upgrade_from_0002_keeps_rows_and_keys_and_downgrades(tmp_path, history_db, gb):
    """A database made at revision 0002 and holding a run (written with 0002's column names) is
    brought to 0003 when opened: its rows kept, its foreign keys pointing at the renamed keys
    (and enforced, ON DELETE CASCADE included), the commands reading it; the downgrade renames
    the columns back with the rows still there."""
    import sqlalchemy as sa
    from alembic import command

    from gpubench.history.db import _alembic_config, make_engine, resolve_url
    from gpubench.history.store import parsed_run

    url = resolve_url(history_db)
    engine = make_engine(url)
    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0002")
    old = sa.MetaData()
    old.reflect(engine)
    meta, rows, _ = parsed_run(QUICK)
    with engine.begin() as conn:
        machine = conn.execute(old.tables["machines"].insert().values(
            machine_key="k" * 40, hostname="vm", cpu_model="cpu", first_seen="2026-11-24").returning(
            old.tables["machines"].c.id)).scalar_one()
        run = conn.execute(old.tables["runs"].insert().values(
            run_key="r" * 40, run_id=meta["run_id"], suite="quick", machine_id=machine, created_at=meta["created_at"],
            complete=True, commit="c" * 40, tags={"source": "0002"}, env={}, recorded_at="2026-11-24").returning(
            old.tables["runs"].c.id)).scalar_one()
        conn.execute(old.tables["results"].insert(), [{**{k: v for k, v in r.items() if k != "run_pk"},
                                                       "run_id": run} for r in rows])
    engine.dispose()

    engine, _ = engine_of(history_db)  # opening it migrates it
    inspector = sa.inspect(engine)
    fks = {t: [(tuple(f["constrained_columns"]), f["referred_table"], tuple(f["referred_columns"]),
                (f.get("options") or {}).get("ondelete")) for f in inspector.get_foreign_keys(t)]
           for t in ("runs", "results")}
    assert fks == {"runs": [(("machine_pk",), "machines", ("machine_pk",), None)],
                   "results": [(("run_pk",), "runs", ("run_pk",), "CASCADE")]}
    assert {i["name"]: i["column_names"] for i in inspector.get_indexes("runs")}["ix_runs_machine"] == ["machine_pk"]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == "0003"
        assert conn.execute(sa.text("SELECT git_commit FROM runs")).scalar_one() == "c" * 40
        if engine.dialect.name == "sqlite":
            assert conn.execute(sa.text("PRAGMA foreign_key_check")).all() == []
        else:  # the constraint and sequence names follow the columns
            assert set(conn.execute(sa.text("SELECT conname FROM pg_constraint WHERE contype = 'f'")).scalars()) == {
                "runs_machine_pk_fkey", "results_run_pk_fkey"}
            for seq in ("machines_machine_pk_seq", "runs_run_pk_seq", "results_result_pk_seq"):
                assert conn.execute(sa.text("SELECT to_regclass(:s)::text"), {"s": seq}).scalar() == seq
    engine.dispose()
    assert [r["doc"] for r in stored(history_db)] == result_lines(QUICK)
    listed = gb(["history", "list", "--db", history_db])
    assert listed.returncode == 0 and meta["run_id"] in listed.stdout and "cccccccccccc" in listed.stdout
    # new rows after the upgrade (PostgreSQL: the renamed sequences still number them)
    assert gb(["history", "ingest", FRAMEWORKS, "--db", history_db]).returncode == 0
    n = len(result_lines(QUICK)) + len(result_lines(FRAMEWORKS))
    assert count(history_db, "results") == n

    engine, _ = engine_of(history_db)
    with engine.begin() as conn:
        command.downgrade(_alembic_config(conn), "0002")
    with engine.connect() as conn:
        names = {t: {c["name"] for c in sa.inspect(conn).get_columns(t)} for t in ("machines", "runs", "results")}
        assert {"id", "machine_id", "commit", "run_id"} <= names["runs"] and {"id", "run_id"} <= names["results"]
        assert "id" in names["machines"] and conn.execute(sa.text("SELECT COUNT(*) FROM results")).scalar_one() == n
        if conn.dialect.name == "postgresql":  # and back
            assert set(conn.execute(sa.text("SELECT conname FROM pg_constraint WHERE contype = 'f'")).scalars()) == {
                "runs_machine_id_fkey", "results_run_id_fkey"}
            assert conn.execute(sa.text("SELECT to_regclass('runs_id_seq')::text")).scalar() == "runs_id_seq"
    engine.dispose()
    engine, _ = engine_of(history_db)  # and up again
    with pytest.raises(sa.exc.IntegrityError):  # the foreign key is enforced
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO results (run_pk, config_id, repeat, status, reason, figures, doc) "
                                 "VALUES (999999, 'x', 0, 'ok', '', '{}', '{}')"))
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM runs WHERE run_id = :r"), {"r": meta["run_id"]})
    engine.dispose()
    assert count(history_db, "results") == len(result_lines(FRAMEWORKS))  # its results went with it


def sql_blocks() -> dict[str, dict[str, str]]:
    """docs/history.md's ```sql blocks, by the title of their first line (``-- TITLE
    (DIALECTS)``), each as {dialect: query} (both dialects for "SQLite and PostgreSQL")."""
    out: dict[str, dict[str, str]] = {}
    text = (REPO / "docs" / "history.md").read_text()
    for block in re.findall(r"```sql\n(.*?)```", text, re.S):
        title, dialects = re.match(r"-- (.+) \((.+)\)\n", block).groups()
        for d in dialects.split(" and "):
            out.setdefault(title, {})[{"SQLite": "sqlite", "PostgreSQL": "postgresql"}[d]] = block
    return out


def test_the_docs_sql_queries_return_what_the_data_says(tmp_path, history_db, gb):
    """The queries of docs/history.md's "Reading the history with SQL", run as written on
    known data: three commits on host-a and two on host-b (throughputs scaled per commit),
    and a later, incomplete run on host-b; each query's rows are checked against the values
    computed from the run directories."""
    import sqlalchemy as sa

    dirs = commit_runs(tmp_path / "a", [1.0, 1.1, 0.9], "host-a") + commit_runs(tmp_path / "b", [0.5, 0.55], "host-b")
    late = commit_runs(tmp_path / "late", [0.7, 0.7, 0.7, 0.6], "host-b", name="late")[-1]
    meta = json.loads((late / "run.json").read_text())
    (late / "run.json").write_text(json.dumps({**meta, "completed": False, "finished_at": None}))
    assert gb(["history", "ingest", *dirs, late, "--db", history_db]).returncode == 0

    runs = []
    for d in [*dirs, late]:
        m = json.loads((d / "run.json").read_text())
        runs.append((m, result_lines(d)))
    blocks = sql_blocks()
    assert set(blocks) == {"throughput by commit", "latest complete run per machine", "failed configs of a run"}
    engine, _ = engine_of(history_db)
    dialect = engine.dialect.name
    with engine.connect() as conn:
        got = {title: [tuple(r) for r in conn.execute(sa.text(queries[dialect]))] for title, queries in blocks.items()}
    engine.dispose()

    by_commit: dict[tuple[str, str], list[float]] = {}
    for m, lines in runs:
        for x in lines:
            if x["config_id"] == CONFIG and x["status"] == "ok":
                key = (m["provenance"]["commit"], m["provenance"]["commit_time"])
                by_commit.setdefault(key, []).append(x["metrics"]["throughput"]["median"])
    expected = [(c, t, len(v), sum(v) / len(v)) for (c, t), v in sorted(by_commit.items(), key=lambda kv: kv[0][1])]
    assert len(expected) == 4 and [r[:3] for r in got["throughput by commit"]] == [e[:3] for e in expected]
    assert [r[3] for r in got["throughput by commit"]] == pytest.approx([e[3] for e in expected], rel=1e-9)
    assert expected[0][2] == 2  # both machines at the first commit

    latest: dict[str, tuple] = {}
    for m, _ in runs:
        if m["completed"] and (m["env"]["hostname"] not in latest
                               or m["created_at"] > latest[m["env"]["hostname"]][3]):
            latest[m["env"]["hostname"]] = (m["env"]["hostname"], m["run_id"], m["provenance"]["commit"],
                                            m["created_at"])
    assert got["latest complete run per machine"] == [latest["host-a"], latest["host-b"]]
    assert latest["host-b"][1] == "quick-host-b-001"  # not the later, incomplete run

    (lines,) = [lines for m, lines in runs if m["run_id"] == "quick-host-a-000"]
    failed = sorted((x["config_id"], x["repeat"], x["status"], x["reason"]) for x in lines if x["status"] != "ok")
    assert failed and sorted(got["failed configs of a run"]) == failed  # sorted here: the server's collation


# --- a database URL that cannot be read ------------------------------------------------------

def test_a_postgresql_url_with_a_bad_port_is_one_line(tmp_path, write_suite):
    for db, what in (("postgresql://u:secret@localhost:abc/x", "port 'abc' is not a number"),
                     ("postgresql://u@localhost:70000/x", "port 70000 is not between 1 and 65535")):
        for args in (["history", "list", "--db", db],
                     ["run", str(write_suite(FAKE)), "--out", "runs", "--no-report", "--no-calibrate", "--db", db]):
            proc = run_cli(args, cwd=tmp_path)
            assert proc.returncode == 2, proc.stdout + proc.stderr
            (line,) = proc.stderr.strip().splitlines()
            assert line.startswith(f"gpubench: error: --db {db.replace('secret', '***')}: {what}; give "
                                   "postgresql://USER[:PASSWORD]@HOST[:PORT]/NAME"), line
            assert "secret" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_two_legacy_runs_with_one_key_and_no_differing_line_are_not_merged(tmp_path, history_db, gb):
    """Two run.json files from before run_uuid, of one suite, host and second (CI matrix jobs),
    whose results do not collide line by line (here: the same lines, other tags): the second is
    refused by what its run.json says of it (runs.run_digest), not merged into the first."""
    first = legacy_copy(tmp_path / "a" / "run", tags={"job": "a"})
    second = legacy_copy(tmp_path / "b" / "run", tags={"job": "b"})
    assert gb(["history", "ingest", first, "--db", history_db]).returncode == 0
    again = gb(["history", "ingest", first, "--db", history_db])  # the same run again: nothing new, no error
    assert again.returncode == 0, again.stderr
    proc = gb(["history", "ingest", second, "--db", history_db])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "another run with the same key" in line and "this run was not recorded" in line
    assert count(history_db, "runs") == 1 and len(stored(history_db)) == len(result_lines(first))
