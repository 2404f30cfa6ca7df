"""The CLI with the real backends: list, env, and one tiny run checked against the schema."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from tests.conftest import REPO, plain_env, plugin_env, result_lines, run_cli

pytest.importorskip("torch")

TINY = """
name = "tiny"
[defaults]
warmup_steps = 1
steps = 4
windows = 2
timeout_s = 180
[matrix]
workload = ["mlp"]
depth = [1]
width = [32]
framework = ["torch", "tensorflow"]
device = ["cpu", "cuda"]
precision = ["fp32", "amp-fp16"]
batch_size = [16]
[[matrix.exclude]]
framework = "tensorflow"
precision = "amp-fp16"
"""


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One run shared by the tests below (every gpubench run starts framework processes, seconds
    each): PyTorch's configs, and the same MLP in TensorFlow where it is installed."""
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "tiny.toml").write_text(TINY)
    args = ["run", "tiny.toml", "--out", "runs", "--no-report"]
    if importlib.util.find_spec("tensorflow") is None:
        args += ["--set", "framework=torch"]
    proc = run_cli(args, cwd=tmp, env=plain_env())
    (run_dir,) = list((tmp / "runs").iterdir())
    return proc, run_dir, {r["config_id"]: r for r in result_lines(run_dir)}


def test_run_writes_schema_complete_results(tiny_run):
    proc, run_dir, all_results = tiny_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {k: r for k, r in all_results.items() if r["config"]["framework"] == "torch"}
    assert sorted(results) == [
        "mlp_depth1_width32-torch-cpu-bs16-amp-fp16-single",
        "mlp_depth1_width32-torch-cpu-bs16-fp32-single",
        "mlp_depth1_width32-torch-cuda-bs16-amp-fp16-single",
        "mlp_depth1_width32-torch-cuda-bs16-fp32-single",
    ]
    assert results["mlp_depth1_width32-torch-cpu-bs16-amp-fp16-single"]["status"] == "unsupported"
    r = results["mlp_depth1_width32-torch-cpu-bs16-fp32-single"]
    assert r["status"] == "ok" and r["reason"] == ""
    for key in ("schema_version", "run_id", "config_id", "config_hash", "repeat", "env", "started_at", "duration_s"):
        assert key in r
    assert {k: r["config"][k] for k in ("workload", "framework", "device", "batch_size", "precision", "parallelism")} == {
        "workload": "mlp", "framework": "torch", "device": "cpu", "batch_size": 16, "precision": "fp32",
        "parallelism": "single"}
    m = r["metrics"]
    assert set(m["throughput"]) >= {"median", "ci_low", "ci_high"}
    assert m["throughput"]["ci_low"] <= m["throughput"]["median"] <= m["throughput"]["ci_high"]
    assert set(m["step_time_ms"]) >= {"median", "p5", "p95", "iqr", "cv"}
    assert len(m["step_times_ms"]) == 8
    assert m["throughput"]["median"] == pytest.approx(16 * 1000 / m["step_time_ms"]["median"])
    assert m["cold_start_ms"] > 0
    assert set(m["loss"]) >= {"first", "last"}
    assert m["memory"]["peak_rss_bytes"] >= m["memory"]["baseline_rss_bytes"] > 0
    assert r["model"] == {"params": 784 * 32 + 32 + 32 * 10 + 10, "flops_per_sample": 2 * 2 * 784 * 32 + 3 * 2 * 32 * 10,
                          "forward_flops_per_sample": 2 * 784 * 32 + 2 * 32 * 10, "source": "builtin",
                          "identical": True,
                          "flops_counted_by": "gpubench, from the spec (convolutions and matrix multiplies)"}
    assert r["env"]["frameworks"]["torch"]["available"] is True
    assert r["env"]["cpu_logical_cores"] >= 1
    assert [p["name"] for p in r["phases"]] == ["cold_start", "warmup", "window_0", "window_1"]
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["suite"]["name"] == "tiny" and meta["args"]["repeats"] == 1 and meta["env"]["python"]


def test_list_shows_suites_workloads_frameworks_and_devices(tmp_path):
    proc = run_cli(["list", "--suites-dir", str(REPO / "suites")], cwd=tmp_path, env=plain_env())
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "quick" in out and "1,199,882" in out and "mlp" in out and "depth=2" in out
    assert "torch" in out and "cpu" in out


def test_env_json_is_the_fingerprint(tmp_path):
    proc = run_cli(["env", "--json"], cwd=tmp_path, env=plain_env())
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)
    for key in ("hostname", "cpu_model", "python", "gpubench", "gpus", "frameworks"):
        assert key in env
    torch_info = env["frameworks"]["torch"]
    assert torch_info["available"] and torch_info["version"]
    assert "num_threads" in torch_info["build"]


def test_both_frameworks_run_the_same_config(tiny_run):
    if importlib.util.find_spec("tensorflow") is None:  # (importorskip would import it here: seconds)
        pytest.skip("tensorflow is not installed")
    proc, _, results = tiny_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    torch_r = results["mlp_depth1_width32-torch-cpu-bs16-fp32-single"]
    tf_r = results["mlp_depth1_width32-tensorflow-cpu-bs16-fp32-single"]
    assert torch_r["status"] == tf_r["status"] == "ok"
    assert torch_r["model"] == tf_r["model"]
    assert torch_r["metrics"]["loss"]["first"] == pytest.approx(tf_r["metrics"]["loss"]["first"], rel=1e-4)
    assert tf_r["env"]["frameworks"]["tensorflow"]["build"]["keras"]


@pytest.mark.slow
def test_a_missing_framework_is_unavailable_with_the_install_command(tmp_path, write_suite):
    """TensorFlow made unimportable: its config ends unavailable with the install command and
    the other framework's config still trains (the fake one: which framework trains is not the
    point here)."""
    blocked = tmp_path / "blocked" / "tensorflow"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('No module named tensorflow (blocked for this test)')\n")
    env = plugin_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "blocked"), str(REPO)])
    suite = write_suite('[defaults]\nworkload = "fault"\nbatch_size = 8\nwarmup_steps = 1\nsteps = 3\nwindows = 2\n'
                        '[matrix]\nframework = ["fake", "tensorflow"]\n')
    # (no calibration: without TensorFlow it would be another machine key, calibrated afresh; a
    # calibration without a framework is test_calibrate's)
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--no-report", "--no-calibrate"],
                   cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    fake_r, tf_r = result_lines(run_dir)
    assert fake_r["status"] == "ok"
    assert tf_r["status"] == "unavailable"
    assert "tensorflow is not installed" in tf_r["reason"] and "pip install tensorflow-cpu==2.21.0" in tf_r["reason"]
