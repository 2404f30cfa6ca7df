"""Same-job A/B, the pytest-benchmark plugin, and the exporters."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from tests.conftest import REPO, plugin_env, run_cli

SUITE = """
name = "ab"
[defaults]
framework = "fake"
workload = "fault"
batch_size = 8
warmup_steps = 2
steps = 10
windows = 2
"""


def side_path(tmp_path, name: str, sleep_ms: float) -> str:
    """A directory whose sitecustomize gives the fake backend a fixed cost per step."""
    d = tmp_path / name
    d.mkdir()
    (d / "sitecustomize.py").write_text(f"import os\nos.environ['FAKE_STEP_SLEEP_MS'] = '{sleep_ms}'\n")
    return os.pathsep.join([str(d), str(REPO)])


@pytest.mark.slow
@pytest.mark.parametrize("candidate_ms, expected_rc, verdict", [(2.0, 0, None), (4.0, 1, "regressed")])
def test_ab_interleaves_two_environments_and_gates(tmp_path, write_suite, candidate_ms, expected_rc, verdict):
    suite = write_suite(SUITE)
    proc = run_cli(["ab", str(suite), "--baseline-python", sys.executable, "--baseline-path",
                    side_path(tmp_path, "a", 2.0), "--candidate-python", sys.executable, "--candidate-path",
                    side_path(tmp_path, "b", candidate_ms), "--repeats", "6", "--out", str(tmp_path / "runs"),
                    "--markdown", str(tmp_path / "gate.md"), "--no-report"], cwd=tmp_path, timeout=600)
    assert proc.returncode == expected_rc, proc.stdout + proc.stderr
    (root,) = (tmp_path / "runs").iterdir()
    base = [json.loads(l) for l in (root / "baseline" / "results.jsonl").read_text().splitlines()]
    cand = [json.loads(l) for l in (root / "candidate" / "results.jsonl").read_text().splitlines()]
    assert len(base) == len(cand) == 6
    # interleaved: A B, B A, ... by start time
    order = sorted([(r["started_at"], "A") for r in base] + [(r["started_at"], "B") for r in cand])
    assert len(order) == 12
    md = (tmp_path / "gate.md").read_text()
    if verdict:
        assert f"**{verdict}**" in md
        assert "REGRESSION" in proc.stdout
    else:
        assert "regressed" not in md.split("\n", 5)[-1] and "no regression" in proc.stdout


def test_ab_bad_input(tmp_path, write_suite):
    suite = write_suite(SUITE)
    proc = run_cli(["ab", str(suite), "--baseline-python", "/no/python", "--candidate-python", sys.executable,
                    "--out", str(tmp_path / "runs")], cwd=tmp_path)
    assert proc.returncode == 2 and "--baseline-python /no/python: no such interpreter" in proc.stderr
    proc = run_cli(["ab", str(suite), "--baseline-python", sys.executable, "--candidate-python", sys.executable,
                    "--repeats", "2", "--out", str(tmp_path / "runs")], cwd=tmp_path)
    assert proc.returncode == 2 and "--repeats 2: comparing 1 config(s) at alpha 0.01 needs at least 5" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("option, message", [
    (["--alpha", "0"], "--alpha 0: must be between 0 and 1"),
    (["--alpha=-1"], "--alpha -1: must be between 0 and 1"),
    (["--alpha", "2"], "--alpha 2: must be between 0 and 1"),
    (["--metric", "latency"], "--metric latency: expected one of: throughput, step_ms (or step_time), peak_memory_bytes"),
    (["--noise-floor", "10%"], "--noise-floor 10% is above --threshold 3%"),
    (["--threshold", "fast"], "--threshold fast: expected a percentage"),
])
def test_ab_checks_the_gate_options_as_compare_does_before_running_anything(tmp_path, write_suite, option, message):
    suite = write_suite(SUITE)
    proc = run_cli(["ab", str(suite), "--baseline-python", sys.executable, "--candidate-python", sys.executable,
                    "--out", str(tmp_path / "runs"), *option], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith(f"gpubench: error: {message}")
    assert proc.stderr.count("\n") == 1 and proc.stdout == "", proc.stdout + proc.stderr  # no probe, no config ran
    assert not (tmp_path / "runs").exists()
    compare = run_cli(["compare", str(tmp_path), str(tmp_path), *option], cwd=tmp_path)  # the same words
    assert compare.returncode == 2 and message in compare.stderr


PLUGIN_TEST = """
import os


def test_fake_training_step(gpubench_benchmark):
    step = gpubench_benchmark(framework="fake", workload="fault", batch_size=int(os.environ.get("BS", "8")),
                              steps_per_round=5, rounds=5, warmup_rounds=1)
    assert step.throughput > 0
    assert step.samples_per_round == 5 * int(os.environ.get("BS", "8"))


def test_unavailable_config_is_skipped(gpubench_benchmark):
    gpubench_benchmark(framework="fake", workload="fault", device="cuda")


def test_bad_max(gpubench_benchmark):
    gpubench_benchmark(framework="fake", workload="fault", batch_size="max")


def test_bad_key(gpubench_benchmark):
    gpubench_benchmark(framework="fake", workload="fault", batch=8)


def test_bad_value(gpubench_benchmark):
    gpubench_benchmark(framework="fake", workload="fault", precision="fp8")


def test_bad_workload(gpubench_benchmark):
    gpubench_benchmark(framework="fake", workload="nope")


def test_bad_ddp(gpubench_benchmark):
    gpubench_benchmark(framework="fake", workload="fault", parallelism="ddp:2")
"""


def run_pytest(tmp_path, *args, **env):
    (tmp_path / "test_bench.py").write_text(PLUGIN_TEST)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_bench.py",
                           "--benchmark-storage", str(tmp_path / "store"), *args], cwd=tmp_path,
                          env=plugin_env(**env), capture_output=True, text=True, timeout=300)


def test_pytest_plugin_is_registered():
    assert "gpubench.pytest_plugin" in {ep.value for ep in entry_points(group="pytest11")}


def test_pytest_benchmark_fixture_and_compare_fail(tmp_path):
    proc = run_pytest(tmp_path, "-k", "not bad", "--benchmark-autosave", "--benchmark-json", str(tmp_path / "b.json"),
                      BS="8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped" in proc.stdout
    data = json.loads((tmp_path / "b.json").read_text())
    (bench,) = data["benchmarks"]
    assert bench["extra_info"]["config_id"] == "fault_mode0-fake-cpu-bs8-fp32-single"
    assert bench["extra_info"]["samples_per_round"] == 40 and bench["stats"]["rounds"] == 5
    assert bench["extra_info"]["throughput_median"] == pytest.approx(40 / bench["stats"]["median"])
    # the same test made 40 times more expensive per round: pytest-benchmark's gate fails it
    slow = run_pytest(tmp_path, "-k", "not bad", "--benchmark-compare", "--benchmark-compare-fail=median:5%",
                      BS="320", FAKE_STEP_SLEEP_MS="5")
    assert slow.returncode != 0 and "Performance has regressed" in slow.stdout + slow.stderr
    # with pytest-benchmark disabled (as under pytest-xdist), the model still trains, and the test
    # says why it has no figure instead of failing on the missing statistics
    off = run_pytest(tmp_path, "-k", "not bad", "--benchmark-disable", "-rs")
    assert off.returncode == 0 and "2 skipped" in off.stdout, off.stdout + off.stderr
    assert "gpubench_benchmark: fault_mode0-fake-cpu-bs8-fp32-single trained, untimed: pytest-benchmark is disabled" \
        in off.stdout


def test_pytest_plugin_bad_settings_fail_with_one_line(tmp_path):
    proc = run_pytest(tmp_path, "-k", "bad", "-rf")
    assert proc.returncode == 1 and "5 failed" in proc.stdout, proc.stdout
    # each failure's section holds its one line (pytest's short summary would truncate them)
    sections = dict(re.findall(r"_{3,} (test_bad_\w+) _{3,}\n(.*?)(?=\n_{3,} |\n=+ short)", proc.stdout, re.S))
    assert sorted(sections) == ["test_bad_ddp", "test_bad_key", "test_bad_max", "test_bad_value", "test_bad_workload"]
    assert "gpubench_benchmark: batch_size: 'max' is searched by gpubench run" in sections["test_bad_max"]
    assert "unknown key 'batch'" in sections["test_bad_key"] and "batch_size" in sections["test_bad_key"]
    assert "gpubench_benchmark: precision" in sections["test_bad_value"] and "amp-bf16" in sections["test_bad_value"]
    assert "unknown workload 'nope'" in sections["test_bad_workload"] and "mlp" in sections["test_bad_workload"]
    assert "parallelism: ddp:2 needs one process per rank" in sections["test_bad_ddp"]
    assert "Traceback" not in proc.stdout


AB_TEST = """
import os


def gate(gpubench_ab, candidate, **settings):
    return gpubench_ab(candidate_path=candidate, framework="fake", workload="fault", batch_size=8,
                       warmup_steps=2, steps=10, windows=2, repeats=8, budget=None, **settings)


def test_same_code(gpubench_ab):
    found = gate(gpubench_ab, os.environ["SAME"])
    assert found.regressed == [] and found.data["paired"] is True
    print("VERDICT", found.verdicts)


def test_slower_code(gpubench_ab):
    gate(gpubench_ab, os.environ["SLOWER"])


def test_bad_key(gpubench_ab):
    gate(gpubench_ab, os.environ["SAME"], batch=8)
"""


@pytest.mark.slow
def test_gpubench_ab_fixture_gates_a_test_on_two_checkouts(tmp_path):
    (tmp_path / "test_ab.py").write_text(AB_TEST)
    env = plugin_env(SAME=side_path(tmp_path, "same", 2.0), SLOWER=side_path(tmp_path, "slower", 4.0))
    baseline = side_path(tmp_path, "base", 2.0)

    def pytest_run(*args):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_ab.py",
                               *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

    proc = pytest_run("--gpubench-baseline-path", baseline)
    out = proc.stdout
    assert proc.returncode == 1 and "1 passed" in out and "2 failed" in out, out + proc.stderr
    # the same code: never regressed; 8 rounds of 2 ms steps on a loaded CI machine may leave it undecided
    assert re.search(r"VERDICT \{'fault_mode0-fake-cpu-bs8-fp32-single': '(unchanged|inconclusive)'\}", out), out
    # the slower candidate fails its test with gpubench's verdict table; a bad key with one line
    sections = dict(re.findall(r"_{3,} (test_\w+) _{3,}\n(.*?)(?=\n_{3,} |\n=+ short)", out, re.S))
    assert sections["test_slower_code"].startswith("gpubench_ab: regressed: fault_mode0-fake-cpu-bs8-fp32-single")
    # kept where the user finds them, not in pytest's temporary folder: the reproduce command runs
    (slower,) = (tmp_path / ".gpubench" / "pytest-ab").glob("test_slower_code-*")
    assert f"both sides' runs: {slower})" in sections["test_slower_code"]
    assert (slower / "verdicts.json").is_file() and len(list(slower.glob("*/baseline/results.jsonl"))) == 1
    (base_dir,) = slower.glob("*/baseline")
    assert f"gpubench compare {base_dir} " in sections["test_slower_code"].replace("\n", "")
    assert "REGRESSION" in sections["test_slower_code"] and "Traceback" not in sections["test_slower_code"]
    assert sections["test_bad_key"].startswith("gpubench_ab: gpubench ab exited with 2: ")
    assert "unknown key 'batch'" in sections["test_bad_key"]
    skipped = pytest_run("-rs")  # no baseline checkout: skipped with the reason
    assert skipped.returncode == 0 and "3 skipped" in skipped.stdout
    assert "no baseline checkout (give --gpubench-baseline-path DIR or baseline_path=)" in skipped.stdout


def test_export_formats(tmp_path):
    a = REPO / "tests" / "fixtures" / "run_a"
    proc = run_cli(["export", str(a), "--format", "github-action", "--out", str(tmp_path / "gh.json")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    gh = {e["name"]: e for e in json.loads((tmp_path / "gh.json").read_text())}
    assert gh["cnn-torch-cpu-bs32-fp32-single"]["value"] == 800.0
    assert gh["cnn-torch-cpu-bs32-fp32-single"]["unit"] == "samples/s"
    assert "cnn-torch-cuda-bs32-fp32-single" not in gh  # only measured configs
    proc = run_cli(["export", str(a), "--format", "pytest-benchmark", "--out", str(tmp_path / "pb.json")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    pb = json.loads((tmp_path / "pb.json").read_text())
    by_name = {b["name"]: b for b in pb["benchmarks"]}
    # one repeat: one round, its time per sample 1 / 800 samples/s; OPS is gpubench's throughput
    assert by_name["cnn-torch-cpu-bs32-fp32-single"]["stats"]["median"] == pytest.approx(1 / 800.0)
    assert by_name["cnn-torch-cpu-bs32-fp32-single"]["stats"]["ops"] == pytest.approx(800.0)
    assert by_name["cnn-torch-cpu-bs32-fp32-single"]["stats"]["rounds"] == 1
    cli = shutil.which("pytest-benchmark", path=os.path.dirname(sys.executable)) or shutil.which("pytest-benchmark")
    compare = subprocess.run([cli, "compare", str(tmp_path / "pb.json")], capture_output=True, text=True)
    assert compare.returncode == 0 and "cnn-torch-cpu-bs32-fp32-single" in compare.stdout


def test_export_takes_only_what_the_result_shape_guarantees(tmp_path):
    # only ok repeats are exported (the store guarantees each has a throughput); a line without
    # samples_per_step is refused on load (the store's shape check), never a traceback
    from tests.test_gate import write_run

    run = write_run(tmp_path / "run", {"cnn": [1000.0] * 2, "mlp": [500.0]})
    lines = [json.loads(l) for l in (run / "results.jsonl").read_text().splitlines()]
    lines[2]["status"], lines[2]["reason"] = "oom", "out of memory"
    (run / "results.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    proc = run_cli(["export", str(run), "--format", "pytest-benchmark"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [b["name"] for b in json.loads(proc.stdout)["benchmarks"]] == ["cnn"]
    del lines[0]["metrics"]["samples_per_step"]
    (run / "results.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    proc = run_cli(["export", str(run), "--format", "pytest-benchmark"], cwd=tmp_path)
    assert proc.returncode == 2 and "'metrics.samples_per_step' is null" in proc.stderr and "Traceback" not in proc.stderr
