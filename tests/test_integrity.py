"""Nothing lost, ever: every point of a sweep has an id of its own, a run directory has one
writer, workers die with their parent, sweeps are bounded, a full disk is not a config's
failure, and readers refuse what would falsify a figure. Real processes (the fake backend)
where the defect needs them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from gpubench.config import DEFAULTS, NAMEABLE, Config
from gpubench.suite import parse_suite
from tests.conftest import fake_suite, plugin_env, result_lines, run_cli

FAKE = fake_suite("integrity", timeout_s=30)

# a second value of every setting an id may name (the first is the default)
OTHER = {"optimizer": "sgd", "lr": 0.01, "loss": None, "compile": "xla", "memory_format": "channels-last",
         "data": "pipeline", "data_workers": 0, "threads": 1, "huge_pages": "transparent", "dataset": "mnist",
         "data_dir": "/data/b/mnist", "checkpointing": "activations", "warmup_steps": 3, "steps": 7, "windows": 2,
         "window_s": 0.5, "timeout_s": 99.0, "seed": 3, "telemetry_interval_ms": 0, "max_batch_start": 8,
         "max_batch_limit": 512, "pipeline_microbatches": 2, "pipeline_schedule": "1f1b", "nnodes": 2}


def _suite(matrix: dict) -> list[Config]:
    return parse_suite({"name": "t", "defaults": {"workload": "cnn"}, "matrix": matrix}, "t.toml").expand()


# --- identity ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in NAMEABLE if OTHER.get(n) is not None])
def test_a_sweep_over_any_setting_gives_every_point_its_own_id(name):
    """Two configs that differ in one setting (any setting) never share an id or a file name."""
    base = Config("cnn")
    # the settings a config uses only in some settings: put both points where it is used
    where = {"data_workers": {"data": "pipeline"}, "pipeline_microbatches": {"parallelism": "pipeline:2"},
             "pipeline_schedule": {"parallelism": "pipeline:2"}, "data_dir": {"dataset": "mnist"},
             "max_batch_start": {"batch_size": "max"}, "max_batch_limit": {"batch_size": "max"}}.get(name, {})
    a = replace(base, **where)
    b = replace(a, **{name: OTHER[name]})
    assert a != b
    from gpubench.suite import name_differences

    named = name_differences([a, b], "t.toml")
    assert named[0].config_id != named[1].config_id
    assert f"{name}=" in named[1].config_id
    # the id round-trips through a result line
    assert Config.from_dict(json.loads(json.dumps(named[1].to_dict()))).config_id == named[1].config_id


def test_ids_name_only_what_differs_and_stay_readable():
    configs = _suite({"seed": [0, 1, 2], "steps": [5], "precision": ["fp32", "amp-bf16"]})
    ids = [c.config_id for c in configs]
    assert ids == ["cnn-torch-cpu-bs64-fp32-single", "cnn-torch-cpu-bs64-fp32-single-seed=1",
                   "cnn-torch-cpu-bs64-fp32-single-seed=2", "cnn-torch-cpu-bs64-amp-bf16-single",
                   "cnn-torch-cpu-bs64-amp-bf16-single-seed=1", "cnn-torch-cpu-bs64-amp-bf16-single-seed=2"]
    # a measurement setting the sweep varies is named; one it shares is not
    ids = [c.config_id for c in _suite({"steps": [5, 10], "windows": [3]})]
    assert ids == ["cnn-torch-cpu-bs64-fp32-single-steps=5", "cnn-torch-cpu-bs64-fp32-single-steps=10"]
    # the config hash is the settings', not how the id is written
    (one,) = _suite({"steps": [5]})
    assert one.config_hash == replace(one, id_keys=("steps",)).config_hash


def test_a_setting_where_it_does_nothing_makes_no_new_point():
    """data_workers without the input pipeline (and the like) would train alike under two
    configs: the sweep has one point there, and two where the setting is used."""
    configs = _suite({"data": ["device", "pipeline"], "data_workers": [0, 2]})
    assert [c.config_id for c in configs] == ["cnn-torch-cpu-bs64-fp32-single",
                                              "cnn-torch-cpu-bs64-fp32-single-data=pipeline-data_workers=0",
                                              "cnn-torch-cpu-bs64-fp32-single-data=pipeline"]
    assert configs[0].data_workers == DEFAULTS["data_workers"]


def test_a_seed_sweep_runs_resumes_ingests_and_compares_every_point(tmp_path, write_suite):
    """Two seeds and two step counts: four results, four logs, a resume that runs nothing,
    four rows in the history, four configs exported (none pooled with another)."""
    suite = write_suite(FAKE + "[matrix]\nseed = [0, 1]\nsteps = [3, 4]\n")
    out = tmp_path / "runs"
    proc = run_cli(["run", str(suite), "--out", str(out), "--no-report"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = out.iterdir()
    results = result_lines(run_dir)
    assert len({r["config_id"] for r in results}) == 4 and len(results) == 4
    assert len(list((run_dir / "logs").iterdir())) == 4
    assert {(r["config"]["seed"], r["config"]["steps"]) for r in results} == {(s, n) for s in (0, 1) for n in (3, 4)}
    meta = json.loads((run_dir / "run.json").read_text())  # the run's id: unique from its creation
    assert meta["run_id"] == run_dir.name and meta["run_id"].endswith("-" + meta["run_uuid"][:6])
    again = run_cli(["run", "--resume", str(run_dir), "--no-report"], cwd=tmp_path)
    assert again.returncode == 0 and "0 to run" in again.stdout, again.stdout + again.stderr
    db = tmp_path / "h.db"
    ingest = run_cli(["history", "ingest", str(run_dir), "--db", str(db)], cwd=tmp_path)
    assert ingest.returncode == 0, ingest.stdout + ingest.stderr
    import sqlite3

    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM results").fetchone()[0] == 4
    exp = run_cli(["export", str(run_dir), "--format", "github-action", "--out", str(tmp_path / "ga.json")],
                  cwd=tmp_path)
    assert exp.returncode == 0, exp.stdout + exp.stderr
    assert len({e["name"] for e in json.loads((tmp_path / "ga.json").read_text())}) == 4


def test_resuming_a_run_of_another_gpubench_that_named_configs_differently_is_refused(tmp_path, write_suite):
    suite = write_suite(FAKE + "[matrix]\nseed = [0, 1]\n")
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--no-report"], cwd=tmp_path)
    (run_dir,) = (tmp_path / "runs").iterdir()
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    old = json.loads(lines[1])
    old["config_id"] += "-as-named-before"  # as a gpubench that named its configs otherwise
    (run_dir / "results.jsonl").write_text(lines[0] + "\n" + json.dumps(old) + "\n")
    proc = run_cli(["run", "--resume", str(run_dir), "--no-report"], cwd=tmp_path)
    assert proc.returncode == 2 and "written by another gpubench version" in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


# --- bounded sweeps --------------------------------------------------------------------------


def test_a_huge_matrix_is_refused_before_it_is_built(tmp_path, write_suite):
    axes = "\n".join(f"{k} = [{', '.join(str(i) for i in range(1, 101))}]"
                     for k in ("seed", "steps", "windows", "warmup_steps", "telemetry_interval_ms"))
    suite = write_suite(FAKE.replace("steps = 3\nwindows = 2\n", "") + "[matrix]\n" + axes + "\n")
    t0 = time.monotonic()
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs")], cwd=tmp_path, timeout=60)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "up to 10,000,000,000 points" in line and "seed 100, steps 100" in line
    assert "--max-jobs N" in line and not (tmp_path / "runs").exists()
    # whatever --max-jobs says: the plan is bounded (every config is held in memory while planned)
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--max-jobs", "100000000000000"], cwd=tmp_path)
    assert proc.returncode == 2 and "argument --max-jobs: at most 100,000" in proc.stderr, proc.stderr
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--max-jobs", "100000"], cwd=tmp_path)
    assert proc.returncode == 2 and "no sweep may have more than 100,000" in proc.stderr, proc.stderr
    # an integer of 5001 digits: tomllib's own limit, as one line
    suite.write_text(FAKE.replace("batch_size = 8", "batch_size = " + "9" * 5001))
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs")], cwd=tmp_path)
    assert proc.returncode == 2 and "invalid TOML: Exceeds the limit (4300 digits)" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_repeats_and_parallelism_are_bounded_and_the_cap_can_be_raised(tmp_path, write_suite):
    suite = write_suite(FAKE + "[matrix]\nseed = [0, 1, 2]\n")
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--repeats", "1000000000"], cwd=tmp_path,
                   timeout=60)
    said = "up to 3 points (before exclude) x 1000000000 repeats = 3,000,000,000 jobs"
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--max-jobs", "2"], cwd=tmp_path)
    assert proc.returncode == 2 and "above the cap of 2 config repeats" in proc.stderr, proc.stderr
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--set", "parallelism=multiworker:100000"],
                   cwd=tmp_path)
    assert proc.returncode == 2 and "N must be 1..256 for multiworker" in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--max-jobs", "3", "--no-report"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- one writer; workers die with their parent ------------------------------------------------


def _worker_of(parent: psutil.Process, timeout_s: float = 60) -> psutil.Process:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for p in parent.children(recursive=True):
            try:
                if "gpubench.runner.worker" in " ".join(p.cmdline()) and "fault_mode2" in " ".join(p.cmdline()):
                    return p
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise AssertionError("the hanging worker never started")


HANG = FAKE + "[matrix]\nmode = [0, 2]\n"


def test_a_second_writer_of_a_run_directory_is_refused_naming_the_holder(tmp_path, write_suite):
    suite = write_suite(HANG)
    out = tmp_path / "runs"
    first = subprocess.Popen([sys.executable, "-m", "gpubench", "run", str(suite), "--out", str(out), "--no-report"],
                             cwd=tmp_path, env=plugin_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _worker_of(psutil.Process(first.pid))
        (run_dir,) = out.iterdir()
        second = run_cli(["run", "--resume", str(run_dir), "--no-report"], cwd=tmp_path)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"another gpubench is writing this run directory (pid {first.pid} on " in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert [r["config"]["workload_params"]["mode"] for r in result_lines(run_dir)] == [0]


@pytest.mark.slow
def test_two_resumes_of_one_directory_run_each_config_once(tmp_path, write_suite):
    suite = write_suite(FAKE + "[matrix]\nseed = [0, 1, 2]\n")
    out = tmp_path / "runs"
    assert run_cli(["run", str(suite), "--out", str(out), "--no-report"], cwd=tmp_path).returncode == 0
    (run_dir,) = out.iterdir()
    lines = (run_dir / "results.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "results.jsonl").write_text(lines[0])  # as if interrupted after the first config
    # each step 0.3 s: the two configs left take 4 s or more, so the two resumes overlap
    procs = [subprocess.Popen([sys.executable, "-m", "gpubench", "run", "--resume", str(run_dir), "--no-report"],
                              cwd=tmp_path, env=plugin_env(FAKE_STEP_SLEEP_MS="300"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert sorted(p.returncode for p in procs) == [0, 2], outs
    refused = next(err for (_, err), p in zip(outs, procs) if p.returncode == 2)
    assert "another gpubench is writing this run directory" in refused
    results = result_lines(run_dir)
    assert sorted(r["config"]["seed"] for r in results) == [0, 1, 2]
    assert all(r["status"] == "ok" for r in results)


def test_a_worker_dies_with_its_parent_even_by_kill_9(tmp_path, write_suite):
    """kill -9 of gpubench takes its hanging worker with it; the lock goes with the holder, so
    the resume that follows runs (and the worker does not run beside it)."""
    suite = write_suite(HANG)
    out = tmp_path / "runs"
    parent = subprocess.Popen([sys.executable, "-m", "gpubench", "run", str(suite), "--out", str(out), "--no-report"],
                              cwd=tmp_path, env=plugin_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = _worker_of(psutil.Process(parent.pid))
    parent.kill()
    parent.wait(timeout=30)
    try:
        worker.wait(timeout=10)
    except psutil.TimeoutExpired:
        worker.kill()
        raise AssertionError("the worker outlived its parent") from None
    (run_dir,) = out.iterdir()
    resumed = subprocess.Popen([sys.executable, "-m", "gpubench", "run", "--resume", str(run_dir), "--no-report"],
                               cwd=tmp_path, env=plugin_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        assert _worker_of(psutil.Process(resumed.pid))  # it got the lock and runs the hanging config again
    finally:
        resumed.send_signal(signal.SIGTERM)
        resumed.communicate(timeout=60)


# --- a full disk is not a config's failure ---------------------------------------------------------


def test_a_worker_that_cannot_write_its_outcome_is_not_recorded_as_the_configs_failure(tmp_path, write_suite):
    """Simulated: the worker's files stop at 256 bytes (EFBIG), as on a full disk. The config gets
    no result (so --resume runs it), the sweep stops, the line names the path, exit 2."""
    suite = write_suite(FAKE + "[matrix]\nmode = [0, 7, 1]\n")
    out = tmp_path / "runs"
    proc = run_cli(["run", str(suite), "--out", str(out), "--no-report"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (run_dir,) = out.iterdir()
    err = proc.stderr.strip()
    assert "result.json: the worker could not write it" in err and "not the config's failure" in err, err
    assert f"gpubench run --resume {run_dir}" in err and "Traceback" not in err
    assert [r["config"]["workload_params"]["mode"] for r in result_lines(run_dir)] == [0]


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_full_file_system_stops_the_sweep_and_resume_finishes_it(tmp_path, write_suite):
    """A real full file system (a small tmpfs, where this test may mount one): filled while the
    worker trains, so that its outcome cannot be written."""
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "8m"):
        pytest.skip("cannot mount a tmpfs here (not root); the simulated ENOSPC test covers this path")
    try:
        suite = write_suite(FAKE.replace("steps = 3", "steps = 10") + "[matrix]\nseed = [0, 1]\n")
        out = mnt / "runs"
        env = plugin_env(FAKE_STEP_SLEEP_MS="100")
        proc = subprocess.Popen([sys.executable, "-m", "gpubench", "run", str(suite), "--out", str(out),
                                 "--no-report", "--telemetry-interval-ms", "0"], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while time.time() < deadline and not list(out.glob("*/.work/*/job.json")):
            time.sleep(0.05)
        filler = mnt / "filler"
        with open(filler, "wb") as f:  # every byte left
            try:
                while True:
                    f.write(bytes(1 << 16))
                    f.flush()
            except OSError:
                pass
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 2, stderr
        assert "No space left on device" in stderr and "not the config's failure" in stderr, stderr
        (run_dir,) = out.iterdir()
        assert result_lines(run_dir) == []
        filler.unlink()
        resumed = run_cli(["run", "--resume", str(run_dir), "--no-report"], cwd=tmp_path, env=env)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert [r["status"] for r in result_lines(run_dir)] == ["ok", "ok"]
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_retry_failed_runs_errors_again_without_counting_them_twice(tmp_path, write_suite):
    suite = write_suite(FAKE + "[matrix]\nmode = [0, 1]\n")
    out = tmp_path / "runs"
    assert run_cli(["run", str(suite), "--out", str(out), "--no-report"], cwd=tmp_path).returncode == 1
    (run_dir,) = out.iterdir()
    proc = run_cli(["run", "--resume", str(run_dir), "--retry-failed", "--no-report"], cwd=tmp_path)
    assert proc.returncode == 1 and "1 to run" in proc.stdout, proc.stdout + proc.stderr
    assert "1 error or timeout result(s) moved to" in proc.stderr
    assert [r["status"] for r in result_lines(run_dir)] == ["ok", "error"]
    assert len((run_dir / "superseded.jsonl").read_text().splitlines()) == 1
    proc = run_cli(["run", str(suite), "--retry-failed"], cwd=tmp_path)
    assert proc.returncode == 2 and "only with --resume" in proc.stderr


# --- readers refuse what would falsify a figure ---------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finished")
    (tmp / "s.toml").write_text(FAKE + "[matrix]\nseed = [0, 1]\n")
    proc = run_cli(["run", str(tmp / "s.toml"), "--out", str(tmp / "runs"), "--no-report", "--repeats", "2"], cwd=tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp / "runs").iterdir()
    return run_dir


def _readers(run_dir: Path, tmp: Path) -> list[list[str]]:
    return [["compare", str(run_dir), str(run_dir)], ["export", str(run_dir), "--format", "pytest-benchmark",
                                                       "--out", str(tmp / "pb.json")],
            ["history", "ingest", str(run_dir), "--db", str(tmp / "h.db")], ["report", str(run_dir), "--out",
                                                                              str(tmp / "rep")]]


def test_a_duplicate_config_repeat_is_refused_by_every_reader(tmp_path, finished_run):
    run_dir = tmp_path / "dup"
    shutil.copytree(finished_run, run_dir)
    lines = (run_dir / "results.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "results.jsonl").write_text("".join(lines) + lines[1])
    n = len(lines) + 1
    for args in _readers(run_dir, tmp_path):
        proc = run_cli(args, cwd=tmp_path)
        said = f"results.jsonl:{n}: config {json.loads(lines[1])['config_id']} repeat"
        if args[0] == "report":  # the report builds, without the duplicate, and says so
            assert proc.returncode == 0 and said in proc.stderr and "line skipped" in proc.stderr, proc.stderr
        else:
            assert proc.returncode == 2 and said in proc.stderr, (args, proc.stdout, proc.stderr)
            assert "Traceback" not in proc.stderr


def test_a_deeply_nested_line_is_one_line_not_a_recursion_error(tmp_path, finished_run):
    run_dir = tmp_path / "deep"
    shutil.copytree(finished_run, run_dir)
    with open(run_dir / "results.jsonl", "a") as f:
        f.write("[" * 100000 + "]" * 100000 + "\n")
    for args in _readers(run_dir, tmp_path):
        proc = run_cli(args, cwd=tmp_path)
        assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr, (args, proc.stderr)
        assert "nested deeper than 32 levels" in proc.stderr, (args, proc.stderr)
        assert proc.returncode == (0 if args[0] == "report" else 2), (args, proc.stderr)
    (run_dir / "run.json").write_text("[" * 100000 + "]" * 100000)
    proc = run_cli(["compare", str(run_dir), str(finished_run)], cwd=tmp_path)
    assert proc.returncode == 2 and "run.json: unreadable run file: nested deeper" in proc.stderr, proc.stderr


def test_a_lock_or_results_file_that_is_a_link_is_never_written_through(tmp_path, finished_run):
    """Anyone who can write into a shared run directory could point its .lock or results.jsonl at
    a file of whoever resumes it: the resume refuses in one line, and the file is as it was."""
    mine = tmp_path / "mine.txt"
    mine.write_text("my own file\n")
    for name in (".lock", "results.jsonl"):
        run_dir = tmp_path / f"link{name}"
        shutil.copytree(finished_run, run_dir)
        lines = (run_dir / "results.jsonl").read_text()
        if name == "results.jsonl":  # the results moved aside, the name a link to another's file
            (run_dir / "results.jsonl").rename(run_dir / "kept.jsonl")
        (run_dir / name).unlink(missing_ok=True)
        (run_dir / name).symlink_to(mine)
        proc = run_cli(["run", "--resume", str(run_dir), "--no-report"], cwd=tmp_path)
        assert proc.returncode == 2 and f"{run_dir / name}: a symbolic link" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and mine.read_text() == "my own file\n"
        if name == ".lock":
            assert (run_dir / "results.jsonl").read_text() == lines


def test_a_results_file_that_is_a_fifo_or_a_device_is_one_line_not_a_hang(tmp_path, finished_run):
    for kind in ("fifo", "zero"):
        run_dir = tmp_path / kind
        shutil.copytree(finished_run, run_dir)
        (run_dir / "results.jsonl").unlink()
        if kind == "fifo":
            os.mkfifo(run_dir / "results.jsonl")
            said = "not a regular file"
        else:
            (run_dir / "results.jsonl").symlink_to("/dev/zero")
            said = "a symbolic link"
        proc = run_cli(["compare", str(run_dir), str(finished_run)], cwd=tmp_path, timeout=60)
        assert proc.returncode == 2 and f"{run_dir / 'results.jsonl'}: {said}" in proc.stderr, proc.stderr


def test_a_deep_value_inside_an_object_is_refused_too():
    from gpubench.results.store import decode_line

    deep: object = 1
    for _ in range(40):
        deep = {"k": deep}
    with pytest.raises(ValueError, match="nested deeper than 32"):
        decode_line(json.dumps({"schema_version": 1, "metrics": deep}).encode())
    assert decode_line(b'{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}


def test_a_run_directory_written_by_ab_or_profile_is_not_resumed(tmp_path, finished_run):
    for key, value, command in (("ab_side", "baseline", "gpubench ab"), ("profile_steps", 5, "gpubench profile")):
        run_dir = tmp_path / key
        shutil.copytree(finished_run, run_dir)
        meta = json.loads((run_dir / "run.json").read_text())
        meta["args"][key] = value
        (run_dir / "run.json").write_text(json.dumps(meta))
        proc = run_cli(["run", "--resume", str(run_dir), "--no-report"], cwd=tmp_path)
        assert proc.returncode == 2 and f"written by {command}, which cannot be resumed" in proc.stderr, proc.stderr


def test_a_deeply_nested_telemetry_timeline_is_left_out_of_the_report_with_a_warning(tmp_path, finished_run):
    run_dir = tmp_path / "deep-timeline"
    shutil.copytree(finished_run, run_dir)
    timelines = sorted((run_dir / "telemetry").iterdir())
    assert timelines, "the fake backend's runs keep a telemetry timeline"
    timelines[0].write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}")
    proc = run_cli(["report", str(run_dir), "--out", str(tmp_path / "rep")], cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"telemetry.timeline 'telemetry/{timelines[0].name}'" in proc.stderr and "unreadable" in proc.stderr


def test_compare_says_where_one_id_names_configs_of_different_settings():
    """An id is unique within its sweep; two runs with other --set values may give one id to
    configs that measure differently, and the verdict says so."""
    from gpubench.gate.compare import compare
    from tests.conftest import make_result

    a, b = Config("cnn", steps=20), Config("cnn", steps=50)
    assert a.config_id == b.config_id and a.config_hash != b.config_hash
    base = [make_result(a, rate=100.0 + i, repeat=i) for i in range(6)]
    cur = [make_result(b, rate=100.0 + i, repeat=i) for i in range(6)]
    (verdict,) = compare(base, cur).verdicts
    assert "settings differ: steps 20 vs 50" in verdict.note
    (same,) = compare(base, base).verdicts
    assert "settings differ" not in same.note


def test_a_password_never_shows_in_a_message_about_its_database():
    from gpubench.history.db import display_url

    for url in ("postgresql://u:se:cr@et@h:5432/db", "postgresql://u:p/w@d@h/db", "postgresql://u:x@h/db?password=pw"):
        shown = display_url(url)
        assert "se:cr" not in shown and "et@h" not in shown and "p/w" not in shown and "pw" not in shown, shown
        assert shown.startswith("postgresql://u:***@")
