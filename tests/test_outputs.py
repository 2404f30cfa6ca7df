"""Where gpubench writes: baselines, output paths checked before the work, atomic writes, and
one-line exit-2 errors (never a traceback, a lost result or a half-written file)."""

from __future__ import annotations

import json
import os

import pytest

from gpubench.gate import sides
from gpubench.gate.sides import save_baseline
from gpubench.results.store import write_json_atomic, write_text_atomic
from tests.conftest import run_cli


def write_run(path, n: int = 6, throughput: float = 1000.0):
    """A minimal run directory the gate accepts: one config, ``n`` repeats."""
    path.mkdir(parents=True)
    env = {"cpu_model": "Fixture CPU", "gpus": [], "frameworks": {"torch": {"version": "2.13.0", "build": {}}}}
    (path / "run.json").write_text(json.dumps({"run_id": path.name, "created_at": "now", "env": env}))
    lines = [{"schema_version": 1, "run_id": path.name, "config_id": "cnn", "repeat": i, "config": {"framework": "torch"},
              "status": "ok", "reason": "", "env": env,
              "metrics": {"throughput": {"median": throughput * (1 + 0.001 * i)},
                          "step_time_ms": {"median": 1000.0 / throughput}}} for i in range(n)]
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def one_line_error(proc, code: int = 2) -> str:
    """The process failed with ``code`` and a single stderr line, no traceback; that line."""
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


# --- baseline names --------------------------------------------------------------------------

@pytest.mark.parametrize("name", [".", "..", ".hidden", "_x", "a/b", "a b", ""])
def test_baseline_names_that_could_leave_the_directory_are_refused(tmp_path, name):
    run = write_run(tmp_path / "run")
    keep = tmp_path / "sandbox" / "a"
    write_run(keep / "b" / "other")
    proc = run_cli(["baseline", "save", str(run), name, "--force", "--baselines-dir", str(keep / "b")], cwd=tmp_path)
    line = one_line_error(proc)
    assert f"baseline name {name!r}" in line and "[A-Za-z0-9][A-Za-z0-9_.-]*" in line
    assert (keep / "b" / "other" / "results.jsonl").exists() and sorted(p.name for p in (keep / "b").iterdir()) == [
        "other"]


def test_baseline_save_force_replaces_only_that_baseline(tmp_path):
    bl = tmp_path / "bl"
    save_baseline(write_run(tmp_path / "first", throughput=1.0), "main", bl)
    save_baseline(write_run(tmp_path / "other"), "other", bl)
    save_baseline(write_run(tmp_path / "second", throughput=2.0), "main", bl, force=True)
    assert sorted(p.name for p in bl.iterdir()) == ["main", "other"]  # no .tmp / .old left behind
    assert json.loads((bl / "main" / "run.json").read_text())["run_id"] == "second"
    assert (bl / "other" / "results.jsonl").exists()


def test_only_a_direct_child_is_ever_removed(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "keep").mkdir()
    for name in ("..", ".", "", "x/..", "../keep"):
        with pytest.raises(AssertionError, match="not a direct child"):
            sides._remove_child(tmp_path / "b", name)
    assert (tmp_path / "keep").is_dir() and (tmp_path / "b").is_dir()


# --- atomic writes ---------------------------------------------------------------------------

def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "summary.md"
    write_text_atomic(target, "old\n")

    def killed(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", killed)  # the write fails midway
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(target, "new, and much longer\n")
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["summary.md"]


def test_an_atomic_write_over_a_directory_leaves_no_temporary(tmp_path):
    (tmp_path / "cp").mkdir()
    with pytest.raises(IsADirectoryError):
        write_json_atomic(tmp_path / "cp", {"a": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["cp"] and not any((tmp_path / "cp").iterdir())
