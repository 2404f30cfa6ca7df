"""Where gpubench writes: baselines, output paths checked before the work, atomic writes, and
one-line exit-2 errors (never a traceback, a lost result or a half-written file)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpubench.cli import main
from gpubench.errors import InputError
from gpubench.gate import sides
from gpubench.gate.sides import save_baseline
from gpubench.files import write_atomic, write_text_atomic
from gpubench.results.store import create_run_dir, write_json_atomic
from tests.conftest import run_cli


def write_run(path, n: int = 6, throughput: float = 1000.0):
    """A minimal run directory the gate accepts: one config, ``n`` repeats."""
    from tests.test_gate import write_run as write_gate_run

    return write_gate_run(path, {"cnn": [throughput * (1 + 0.001 * i) for i in range(n)]})


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



def half_then_fail(tmp):
    """A writer killed midway: part of the file, then an error."""
    Path(tmp).write_bytes(b"\x89PNG half")
    raise OSError(28, "No space left on device")


def test_write_atomic_with_a_failing_writer_leaves_no_temporary_and_no_half_file(tmp_path):
    with pytest.raises(OSError, match="No space left"):
        write_atomic(tmp_path / "new.png", half_then_fail)
    assert list(tmp_path.iterdir()) == []  # no target and no temporary file
    old = tmp_path / "old.png"
    old.write_bytes(b"the old chart")
    with pytest.raises(OSError, match="No space left"):
        write_atomic(old, half_then_fail)
    assert old.read_bytes() == b"the old chart" and [p.name for p in tmp_path.iterdir()] == ["old.png"]


def test_write_atomic_gives_the_writer_a_path_with_the_target_suffix(tmp_path):
    seen = []

    def writer(tmp):
        seen.append(tmp)
        Path(tmp).write_text("{}")

    write_atomic(tmp_path / "trace.json", writer)
    assert seen[0].parent == tmp_path and seen[0].suffix == ".json" and seen[0] != tmp_path / "trace.json"
    assert (tmp_path / "trace.json").read_text() == "{}" and [p.name for p in tmp_path.iterdir()] == ["trace.json"]


def test_a_chart_whose_savefig_fails_leaves_no_file(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from gpubench.report import charts

    ok = charts.step_time_boxes({"a": [1.0, 2.0, 3.0]}, tmp_path / "step_times.png")
    assert ok.read_bytes().startswith(b"\x89PNG") and [p.name for p in tmp_path.iterdir()] == ["step_times.png"]
    monkeypatch.setattr(Figure, "savefig", lambda self, fname, **kw: half_then_fail(fname))
    with pytest.raises(OSError, match="No space left"):
        charts.step_time_boxes({"a": [1.0, 2.0, 3.0]}, tmp_path / "boxes.png")
    assert [p.name for p in tmp_path.iterdir()] == ["step_times.png"]


def test_a_torch_trace_export_that_fails_leaves_no_file(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from torch.profiler import profile

    from gpubench.backends import get_backend
    from gpubench.backends.pytorch.profiling import profile_steps
    from gpubench.suite import Config
    from gpubench.workloads import get_workload
    from gpubench.workloads.data import synthetic_batches

    spec = get_workload("mlp").spec(depth=1, width=16)
    config = Config(workload="mlp", framework="torch", batch_size=8, workload_params=(("depth", 1), ("width", 16)))
    trainer = get_backend("torch").build(spec, config, synthetic_batches(spec, 8, 2, seed=0))
    monkeypatch.setattr(profile, "export_chrome_trace", lambda self, path: half_then_fail(path))
    with pytest.raises(OSError, match="No space left"):
        profile_steps(trainer, 1, tmp_path)
    assert list(tmp_path.iterdir()) == []

# --- output paths: checked before the work ------------------------------------------------------

FAKE_SUITE = """
name = "fk"
[defaults]
framework = "fake"
workload = "fault"
batch_size = 8
"""
PY = sys.executable
_NOT_DIR = ": afile is not a directory"


@pytest.mark.parametrize("args, message", [
    (["run", "{suite}", "--out", "afile"], "--out afile: exists and is not a directory"),
    (["run", "{suite}", "--out", "afile/sub"], "--out afile/sub" + _NOT_DIR),
    pytest.param(["run", "{suite}", "--out", "/proc/gpubench-x"], "--out /proc/gpubench-x: cannot create files in /proc",
                 marks=pytest.mark.skipif(not os.path.isdir("/proc"), reason="no /proc")),
    (["profile", "{suite}", "--out", "afile"], "--out afile: exists and is not a directory"),
    (["ab", "{suite}", "--baseline-python", PY, "--candidate-python", PY, "--repeats", "5", "--out", "afile"],
     "--out afile: exists and is not a directory"),
    (["ab", "{suite}", "--baseline-python", PY, "--candidate-python", PY, "--repeats", "5", "--out", "runs",
      "--markdown", "afile/x.md"], "--markdown afile/x.md" + _NOT_DIR),
    (["report", "{run}", "--out", "afile"], "--out afile: exists and is not a directory"),
    (["compare", "{run}", "{run}", "--markdown", "afile/x.md"], "--markdown afile/x.md" + _NOT_DIR),
    (["compare", "{run}", "{run}", "--json", "afile/x.json"], "--json afile/x.json" + _NOT_DIR),
    (["compare", "{run}", "{run}", "--json", "adir"], "--json adir: is a directory; expected a file path"),
    (["calibrate", "--device", "cpu", "--json", "afile/x.json"], "--json afile/x.json" + _NOT_DIR),
    (["find-batch", "{suite}", "--json", "afile/x.json"], "--json afile/x.json" + _NOT_DIR),
    (["export", "{run}", "--format", "github-action", "--out", "afile/x.json"], "--out afile/x.json" + _NOT_DIR),
    (["export", "{run}", "--format", "github-action", "--out", "adir"], "--out adir: is a directory"),
    (["baseline", "save", "{run}", "main", "--baselines-dir", "afile"],
     "--baselines-dir afile: exists and is not a directory"),
])
def test_unwritable_output_paths_fail_before_the_work(tmp_path, write_suite, args, message):
    suite = write_suite(FAKE_SUITE)
    run = write_run(tmp_path / "run")
    (tmp_path / "afile").write_text("x\n")
    (tmp_path / "adir").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = run_cli([a.format(suite=suite, run=run) for a in args], cwd=tmp_path)
    assert message in one_line_error(proc)
    assert proc.stdout == ""  # nothing probed, measured or compared
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not any((tmp_path / "adir").iterdir())


def test_a_failed_write_after_the_verdicts_is_exit_2_naming_the_flag(tmp_path, monkeypatch, capsys):
    a = write_run(tmp_path / "a")

    def disk_full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("gpubench.results.outputs.write_text_atomic", disk_full)
    assert main(["compare", str(a), str(a), "--markdown", str(tmp_path / "gate.md")]) == 2  # not 0 or 1
    out, err = capsys.readouterr()
    assert "no regression" in out  # the verdicts were printed before the write
    assert err == f"gpubench: error: --markdown {tmp_path / 'gate.md'}: cannot write: No space left on device\n"


def test_an_unchecked_os_error_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    def denied(run_dirs, out=None):
        raise PermissionError(13, "Permission denied", "reports/r")

    monkeypatch.setattr("gpubench.report.build.build_report", denied)
    assert main(["report", str(write_run(tmp_path / "r"))]) == 2
    assert capsys.readouterr().err == "gpubench: error: reports/r: Permission denied\n"


def test_create_run_dir_failures_are_input_errors(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match=r"afile: cannot create a run directory there: File exists"):
        create_run_dir(tmp_path / "afile", "quick-1")


def test_export_names_no_baselines_it_does_not_read(tmp_path):
    proc = run_cli(["export", "nodir", "--format", "github-action"], cwd=tmp_path)
    assert one_line_error(proc) == "gpubench: error: nodir: no such run directory"


def test_export_writes_its_file(tmp_path):
    run = write_run(tmp_path / "run")
    proc = run_cli(["export", str(run), "--format", "github-action", "--out", "sub/gh.json"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads((tmp_path / "sub" / "gh.json").read_text())
    assert entry["name"] == "cnn" and entry["unit"] == "samples/s"
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["gh.json"]


# --- directories to read --------------------------------------------------------------------

def test_list_needs_an_existing_suites_dir_when_one_is_named(tmp_path):
    (tmp_path / "afile").write_text("x")
    for given, why in (("nowhere", "no such directory"), ("afile", "not a directory")):
        proc = run_cli(["list", "--suites-dir", given], cwd=tmp_path)
        assert one_line_error(proc) == f"gpubench: error: --suites-dir {given}: {why}" and proc.stdout == ""


def test_baseline_list_missing_dir_is_empty_but_a_file_is_an_error(tmp_path):
    proc = run_cli(["baseline", "list"], cwd=tmp_path)  # nothing saved yet: not an error
    assert proc.returncode == 0 and "no baselines in .gpubench/baselines" in proc.stdout
    (tmp_path / "afile").write_text("x")
    proc = run_cli(["baseline", "list", "--baselines-dir", "afile"], cwd=tmp_path)
    assert one_line_error(proc) == "gpubench: error: --baselines-dir afile: not a directory"
