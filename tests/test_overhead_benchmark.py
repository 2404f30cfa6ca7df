"""benchmarks/overhead.py runs end to end and writes its figures (no timing assertions)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "overhead.py"


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "overhead.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--depth", "1", "--width", "32", "--batch-size", "16",
         "--steps", "3", "--rounds", "2", "--warmup", "1", "--json", str(out), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())


def test_overhead_script_writes_figures(tmp_path: Path) -> None:
    proc, doc = _run(tmp_path)
    for key in ("config_id", "device", "torch_version", "bare_step_ms", "bare_sps", "gpubench_sps",
                "gpubench_median_sps", "ratio", "ratio_ci", "pair_ratios", "target", "result", "rounds"):
        assert key in doc, key
    assert doc["device"] == "cpu" and doc["aa_test"] is False
    assert doc["config_id"].startswith("mlp_depth1_width32-torch-cpu-bs16-fp32")
    assert len(doc["rounds"]) == 2 and len(doc["pair_ratios"]) == 1
    assert [r["first"] for r in doc["rounds"]] == ["bare", "gpubench"]
    for row in doc["rounds"]:
        for key in ("bare_sps", "gpubench_sps", "gpubench_median_sps", "ratio"):
            assert math.isfinite(row[key]) and row[key] > 0, (key, row)
    assert doc["ratio"] > 0 and doc["ratio_ci"][0] <= doc["ratio"] <= doc["ratio_ci"][1]
    assert doc["result"] in ("PASS", "FAIL", "INCONCLUSIVE", "n/a")
    assert "target ratio >= 0.99" in proc.stdout

