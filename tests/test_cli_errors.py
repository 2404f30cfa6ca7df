"""Bad command lines, plugins and devices: one line on stderr, exit 2; warnings on stderr."""

from __future__ import annotations

import json
import os
import re
import shutil
from contextlib import ExitStack

import pytest
from rich.console import Console

from gpubench.backends import backend_class
from gpubench.calibrate import cache
from gpubench.calibrate.command import check_devices, run_calibrate
from gpubench.errors import InputError
from gpubench.measure.kernels import available_devices
from gpubench.runner.run import RunRequest, _prepare
from gpubench.runner.session import write_report
from gpubench.suite import Suite, parse_suite
from tests.conftest import REPO, plain_env, run_cli
from tests.test_outputs import write_run


@pytest.mark.parametrize("args, message", [
    (["run", "--repeats", "0"], "gpubench run: error: argument --repeats: expected a positive integer, got 0"),
    (["profile", "s.toml", "--steps", "0"], "gpubench profile: error: argument --steps: expected a positive integer"),
    (["find-batch", "s.toml", "--limit", "0"], "gpubench find-batch: error: argument --limit: expected a positive"),
    (["compare", "a", "b", "--alpha", "x"], "gpubench compare: error: argument --alpha: invalid float value: 'x'"),
    (["run", "--telemetry-interval-ms", "abc"], "gpubench run: error: argument --telemetry-interval-ms: invalid int"),
    (["export", "r", "--format", "csv"], "gpubench export: error: argument --format: invalid choice: 'csv'"),
    (["baseline", "save"], "gpubench baseline save: error: the following arguments are required: run_dir, name"),
    ([], "gpubench: error: the following arguments are required: command"),
])
def test_usage_errors_are_one_line_naming_the_help(tmp_path, args, message):
    proc = run_cli(args, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    prog = message.split(": error")[0]
    assert line.startswith(message) and line.endswith(f"(see {prog} --help)")


def test_what_the_user_gave_is_echoed_without_its_escape_sequences(tmp_path):
    """A --set value (or an argument) holding a terminal escape sequence is shown written out,
    never sent to the terminal to obey."""
    for args in (["run", "suites/quick.toml", "--set", "precision=fp3\x1b[31mRED"], ["run", "--max-jobs", "\x1b[2J"]):
        proc = run_cli(args, cwd=REPO)
        assert proc.returncode == 2 and "\x1b" not in proc.stderr and "\\x1b[" in proc.stderr, proc.stderr


def test_help_still_shows_the_usage(tmp_path):
    proc = run_cli(["compare", "--help"], cwd=tmp_path)
    assert proc.returncode == 0 and "usage: gpubench compare" in proc.stdout and "from 0% to below 100%" in proc.stdout


# --- warnings go to stderr -----------------------------------------------------------------------

def _truncate_last_line(run_dir):
    with open(run_dir / "results.jsonl", "a") as f:
        f.write('{"schema_version": 1, "config_id": "cn')  # a run killed while writing


def test_compare_warns_on_stderr(tmp_path):
    a = write_run(tmp_path / "a")
    _truncate_last_line(a)
    proc = run_cli(["compare", str(a), str(a)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stdout and "no regression" in proc.stdout
    assert "gpubench: warning:" in proc.stderr and "truncated last line" in proc.stderr
    # a saved baseline's warnings are gpubench's own lines too, not Python's UserWarning
    assert run_cli(["baseline", "save", str(a), "main"], cwd=tmp_path).returncode == 0
    _truncate_last_line(tmp_path / ".gpubench" / "baselines" / "main")
    proc = run_cli(["baseline", "list"], cwd=tmp_path)
    assert proc.returncode == 0 and "main" in proc.stdout
    assert proc.stderr.startswith("gpubench: warning:") and "UserWarning" not in proc.stderr


def test_resume_warns_on_stderr(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    suite = Suite(name="s", description="", source="s.toml", defaults={"workload": "mlp"})
    (run / "run.json").write_text(json.dumps({"run_id": "run", "suite": suite.to_dict(), "args": {"repeats": 1}}))
    (run / "results.jsonl").write_text("")
    _truncate_last_line(run)
    _, _, resumed, existing = _prepare(RunRequest(suite=None, out=tmp_path, resume=run), ExitStack())
    out, err = capsys.readouterr()
    assert resumed == run and existing == [] and out == ""
    assert err.startswith("gpubench: warning:") and "truncated last line" in err



def test_a_report_that_cannot_be_written_warns_on_stderr(tmp_path, capsys):
    """`run` keeps its results when its report fails, and says so on stderr, not among them."""
    run = write_run(tmp_path / "run")
    (tmp_path / "afile").write_text("")
    write_report([run], Console(), out=tmp_path / "afile")
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("gpubench: warning: report not written: InputError:") and f"gpubench report {run}" in err
    assert err.count("\n") == 1


def test_the_reports_warnings_of_a_run_go_to_stderr(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(REPO / "tests" / "fixtures" / "run_a", run)
    _truncate_last_line(run)
    write_report([run], Console(), out=tmp_path / "report")
    out, err = capsys.readouterr()
    assert out.startswith("report: ") and "truncated" not in out
    assert err.startswith("gpubench: warning:") and "truncated last line" in err
    assert (tmp_path / "report" / "index.html").exists()

def test_calibrate_never_says_cached_when_the_cache_could_not_be_written(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("GPUBENCH_CACHE_DIR", str(tmp_path / "afile" / "cache"))  # cannot be made
    monkeypatch.setattr("gpubench.calibrate.cache.calibration_key", lambda device: {"device": "cpu"})
    warnings = []
    entry = {"device": "cpu", "device_name": "test cpu", "peak_tflops": {"fp32": 1.0},
             "peak_kernels": {"fp32": {"framework": "torch", "op": "linear", "shape": "8x8x8", "size": 8}},
             "memory_bandwidth_gbs": 1.0, "seconds": 0.5}
    cal = cache.get_calibration("cpu", measure=lambda d: entry, warn=warnings.append)
    assert not cal.cached and not cal.saved and cal.cache_file is None
    assert len(warnings) == 1 and warnings[0].startswith("calibration not cached: cannot write")

    monkeypatch.setattr("gpubench.calibrate.command.get_calibration", lambda device, force: cal)
    monkeypatch.setattr(backend_class("torch"), "package_build", classmethod(lambda cls: {"version": "x"}))
    console = Console(record=True, width=200)
    out = tmp_path / "cal.json"
    assert run_calibrate(["cpu"], False, out, console) == 0
    text = console.export_text()
    assert "measured now in 0.5 s, not cached" in text and "cached in" not in text
    (written,) = json.loads(out.read_text())
    assert written["cache_file"] is None and written["from_cache"] is False


# --- plugins -------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, message", [
    ('raise RuntimeError("boom")\n', "plugin module 'badplug' failed to import: RuntimeError: boom (at {path}:1)"),
    ("x = 1\ndef f(:\n", "plugin module 'badplug' failed to import: SyntaxError: "),
    ("import no_such_dependency_xyz\n", "cannot import plugin module 'badplug': No module named 'no_such_dependency_xyz'"),
])
def test_a_broken_plugin_is_one_line_naming_it(tmp_path, source, message):
    path = tmp_path / "badplug.py"
    path.write_text(source)
    env = plain_env()
    env.update(GPUBENCH_PLUGINS="badplug", PYTHONPATH=os.pathsep.join([str(tmp_path), env["PYTHONPATH"]]))
    proc = run_cli(["list"], cwd=tmp_path, env=env)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpubench: error: GPUBENCH_PLUGINS: " + message.format(path=path))


# --- calibrate's devices ---------------------------------------------------------------------------

def test_calibrate_takes_the_suites_device_names():
    assert check_devices(["gpu", "cuda", "cuda:0", "gpu:1", "cpu"]) == ["cuda:0", "cuda:1", "cpu"]
    with pytest.raises(InputError, match=r"--device tpu: unknown device 'tpu'; expected one of: cpu, cuda, cuda:N"):
        check_devices(["tpu"])
    assert [available_devices(n) for n in (0, 1, 4)] == ["cpu", "cpu, cuda:0", "cpu, cuda:0..3"]


def test_a_missing_device_is_one_line_on_stderr_listing_the_devices_here(tmp_path):
    pytest.importorskip("torch")
    env = {**plain_env(), "GPUBENCH_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_cli(["calibrate", "--device", "gpu:99", "--json", str(tmp_path / "c.json")], cwd=tmp_path, env=env)
    assert proc.returncode == 2 and proc.stdout == "" and not (tmp_path / "c.json").exists()
    (line,) = proc.stderr.strip().splitlines()
    assert re.match(r"gpubench: error: cuda:99: no such device here; available: cpu(, cuda:0(\.\.\d+)?)?( \(|$)", line)


# --- suite names become directory names ----------------------------------------------------------

def test_a_suite_name_is_at_most_100_characters(tmp_path, write_suite):
    assert parse_suite({"name": "a" * 100, "defaults": {"workload": "mlp"}}, "s.toml").name == "a" * 100
    with pytest.raises(InputError, match=r"^s\.toml: name: at most 100 characters .*, got 101$"):
        parse_suite({"name": "a" * 101}, "s.toml")
    suite = write_suite('name = "' + "n" * 300 + '"\n[defaults]\nframework = "fake"\nworkload = "fault"\n')
    proc = run_cli(["run", str(suite), "--out", "runs"], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "" and not (tmp_path / "runs").exists()
    assert proc.stderr == f"gpubench: error: {suite}: name: at most 100 characters (run directories are named after " \
                          "it), got 300\n"
