"""benchmarks/overhead.py runs end to end and writes its figures (no timing assertions)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "overhead.py"
# runs the script as __main__, then says which frameworks the run imported
WRAPPER = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    code = e.code
else:
    code = 0
print("frameworks imported:", sorted(m for m in ("torch", "tensorflow") if m in sys.modules))
sys.exit(code)
"""


def _needs(module: str) -> None:
    """Skip without importing the framework here (the script imports it in its own process)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "overhead.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, str(SCRIPT), "--depth", "1", "--width", "32", "--batch-size", "16",
         "--steps", "3", "--rounds", "2", "--warmup", "1", "--json", str(out), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())


def _check_figures(proc: subprocess.CompletedProcess[str], doc: dict, config_id: str, second: str,
                   first: str = "bare") -> None:
    for key in ("config_id", "framework", "device", "device_name", "bare_step_ms", "bare_sps", "gpubench_sps",
                "gpubench_median_sps", "ratio", "ratio_ci", "pair_ratios", "target", "result", "rounds"):
        assert key in doc, key
    assert doc["device"] == "cpu"
    assert doc["config_id"].startswith(config_id)
    assert len(doc["rounds"]) == 2 and len(doc["pair_ratios"]) == 1
    assert [r["first"] for r in doc["rounds"]] == [first, second]
    for row in doc["rounds"]:
        for key in ("bare_sps", "gpubench_sps", "gpubench_median_sps", "ratio"):
            assert math.isfinite(row[key]) and row[key] > 0, (key, row)
        assert math.isfinite(row["bare_loss"]) and math.isfinite(row["gpubench_loss"]), row
    assert doc["bare_step_ms"] > 0 and doc["bare_sps"] > 0 and doc["gpubench_sps"] > 0
    assert doc["ratio"] > 0 and doc["ratio_ci"][0] <= doc["ratio"] <= doc["ratio_ci"][1]
    assert doc["result"] in ("PASS", "FAIL", "INCONCLUSIVE", "n/a")
    assert "target ratio >= 0.99" in proc.stdout


def test_overhead_script_writes_figures(tmp_path: Path) -> None:
    _needs("torch")
    proc, doc = _run(tmp_path)
    _check_figures(proc, doc, "mlp_depth1_width32-torch-cpu-bs16-fp32", "gpubench")
    assert doc["framework"] == "torch" and doc["aa_test"] is False
    assert doc["torch_version"] and doc["num_threads"] >= 1
    assert "frameworks imported: ['torch']" in proc.stdout  # TensorFlow stays out of a torch run


def test_overhead_script_tensorflow(tmp_path: Path) -> None:
    _needs("tensorflow")
    proc, doc = _run(tmp_path, "--framework", "tensorflow")
    _check_figures(proc, doc, "mlp_depth1_width32-tensorflow-cpu-bs16-fp32", "gpubench")
    assert doc["framework"] == "tensorflow" and doc["aa_test"] is False and doc["compile"] == "none"
    assert doc["tensorflow_version"] and doc["keras_version"]
    assert "frameworks imported: ['tensorflow']" in proc.stdout  # torch stays out of a TensorFlow run
    for row in doc["rounds"]:  # the bare loop and gpubench's trainer do the same work, step for step
        assert row["gpubench_loss"] == pytest.approx(row["bare_loss"], rel=1e-3), row


def test_overhead_script_telemetry_mode(tmp_path: Path) -> None:
    _needs("torch")
    proc, doc = _run(tmp_path, "--telemetry", "--interval-ms", "10")
    _check_figures(proc, doc, "mlp_depth1_width32-torch-cpu-bs16-fp32", "on", first="off")
    assert doc["mode"] == "telemetry" and doc["interval_ms"] == 10
    assert "telemetry overhead (sampling off vs on, every 10 ms)" in proc.stdout
    on = [r for r in doc["rounds"] if "host_samples" in r]
    assert len(on) == 2 and all(r["host_samples"] >= 2 and r["gpu_samples"] == 0 for r in on)  # start + stop
    bad = subprocess.run([sys.executable, str(SCRIPT), "--telemetry", "--aa"], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert bad.returncode == 2 and "not allowed with" in bad.stderr


HOST_COST = ROOT / "benchmarks" / "host_reader_cost.py"


def test_host_reader_cost_adds_up_the_readings_of_one_second():
    spec = importlib.util.spec_from_file_location("host_reader_cost", HOST_COST)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    # the default: a reading every 250 ms, the tree re-listed once a second
    assert script.per_second(0.5, 3.0) == pytest.approx(3 * 0.5 + 1 * 3.0)
    assert script.per_second(0.5, 3.0, interval_ms=1000) == pytest.approx(3.0)  # every reading re-lists
    assert script.per_second(0.5, 3.0, interval_ms=2000) == pytest.approx(1.5)  # half a reading a second


def test_host_reader_cost_script_prints_and_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    proc = subprocess.run([sys.executable, str(HOST_COST), "--readings", "5", "--children", "1", "--json", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["tree_processes"] == 2 and doc["readings"] == 5 and doc["interval_ms"] == 250
    assert all(doc[k]["mean"] > 0 for k in ("read_ms", "read_with_relist_ms", "relist_ms"))
    assert doc["cpu_ms_per_s"] == pytest.approx(3 * doc["read_ms"]["mean"] + doc["read_with_relist_ms"]["mean"])
    assert doc["machine_share"] == pytest.approx(doc["cpu_ms_per_s"] / (1000.0 * doc["cpus"]))
    assert f"= {doc['cpu_ms_per_s']:.2f} ms of CPU per second" in proc.stdout
