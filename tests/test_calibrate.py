"""Device calibration (gpubench calibrate), its cache, MFU, and batch_size = "max"."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import pytest
from rich.console import Console

from gpubench.calibrate import cache
from gpubench.calibrate.command import figures_table
from gpubench.calibrate.datasheet import datasheet_for
from gpubench.errors import InputError
from gpubench.results.store import load_results
from gpubench.runner.find_batch import Search, batch_search, run_at_max_batch
from gpubench.runner.mfu import mfu_metrics
from gpubench.runner.sweep import Job
from gpubench.suite import Config, load_suite
from tests.conftest import REPO, plugin_env, run_cli

# --- the cache, with a stand-in for the measuring child ----------------------------------------


class FakeMeasure:
    """Counts calls; returns what the child would print (figures made up for the cache tests)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, device: str) -> dict:
        self.calls += 1
        return {"device": device, "device_name": "test cpu", "matmul_tflops": {"fp32": 0.5 * self.calls, "bf16": 1.0},
                "memory_bandwidth_gbs": 10.0}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBENCH_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cache_miss_hit_corrupt_and_force(cache_dir):
    measure, warnings = FakeMeasure(), []
    first = cache.get_calibration("cpu", measure=measure, warn=warnings.append)  # miss: measured and written
    assert not first.cached and measure.calls == 1 and first.path.parent == cache_dir
    assert first.path.name.startswith("calibration-cpu-") and json.loads(first.path.read_text()) == first.entry
    assert first.entry["key"] == cache.calibration_key("cpu") and first.entry["matmul_tflops"]["fp32"] == 0.5
    hit = cache.get_calibration("cpu", measure=measure, warn=warnings.append)
    assert hit.cached and measure.calls == 1 and hit.entry == first.entry and warnings == []

    first.path.write_text('{"cache_version": 1, "key": ')  # a truncated file
    rebuilt = cache.get_calibration("cpu", measure=measure, warn=warnings.append)
    assert not rebuilt.cached and measure.calls == 2 and rebuilt.entry["matmul_tflops"]["fp32"] == 1.0
    (warning,) = warnings
    assert str(first.path) in warning and "unusable" in warning and "measuring again" in warning and "\n" not in warning
    assert json.loads(first.path.read_text()) == rebuilt.entry  # the rebuilt entry is on disk

    for broken in ({**rebuilt.entry, "matmul_tflops": {"fp32": "fast"}}, {**rebuilt.entry, "key": {"other": 1}},
                   {**rebuilt.entry, "cache_version": 0}, [1, 2],
                   {k: v for k, v in rebuilt.entry.items() if k != "device"}):
        first.path.write_text(json.dumps(broken))
        assert not cache.get_calibration("cpu", measure=measure, warn=warnings.append).cached
    assert measure.calls == 7 and len(warnings) == 6

    forced = cache.get_calibration("cpu", force=True, measure=measure, warn=warnings.append)
    assert not forced.cached and measure.calls == 8 and len(warnings) == 6


def test_cache_key_fields(cache_dir, monkeypatch):
    torch = pytest.importorskip("torch")
    build = cache.torch_build()  # read from torch/version.py without importing torch
    assert build["version"] == torch.__version__ and build["cuda"] == torch.version.cuda
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    key = cache.calibration_key("cpu")
    assert {"hostname", "cpu_model", "torch", "torch_cuda", "cpu_affinity", "thread_env"} <= set(key)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # fewer threads, other peaks: another cache file
    assert cache.cache_file(cache.calibration_key("cpu")) != cache.cache_file(key)
    gpus = [{"name": "GPU A", "uuid": "GPU-aaaa", "driver": "550.1"}, {"name": "GPU B", "uuid": "GPU-bbbb",
                                                                        "driver": "550.1"}]
    monkeypatch.setattr("gpubench.telemetry.nvml.gpu_inventory", lambda: (gpus, None))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    key = cache.calibration_key("cuda:0")
    assert (key["device"], key["gpu_name"], key["gpu_uuid"], key["driver"]) == ("cuda", "GPU B", "GPU-bbbb", "550.1")
    assert "cpu_affinity" not in key and cache.calibration_device("cuda") == "cuda:0"


def test_calibrate_cpu_through_the_cli(tmp_path):
    """Measures (--force: whatever the test session's cache holds) into the session's cache,
    where the runs of later tests find the peaks instead of measuring them again."""
    pytest.importorskip("torch")
    env = plugin_env()
    out = tmp_path / "cal.json"
    proc = run_cli(["calibrate", "--device", "cpu", "--force", "--json", str(out)], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "measured now" in proc.stdout and "matmul fp32 (TFLOP/s)" in proc.stdout
    (entry,) = json.loads(out.read_text())
    assert entry["device"] == "cpu" and not entry["from_cache"] and entry["datasheet"] is None
    assert set(entry["matmul_tflops"]) == {"fp32", "bf16"} and min(entry["matmul_tflops"].values()) > 0
    assert entry["memory_bandwidth_gbs"] > 0
    sizes = entry["details"]["matmul"]["fp32"]["sizes"]
    assert entry["matmul_tflops"]["fp32"] == max(s["tflops"] for s in sizes)  # the best size's median block
    assert all(len(s["blocks_tflops"]) == entry["plan"]["blocks"] for s in sizes)
    again = run_cli(["calibrate", "--device", "cpu", "--json", str(out)], cwd=tmp_path, env=env)
    assert again.returncode == 0 and "from the cache" in again.stdout
    (cached,) = json.loads(out.read_text())
    assert cached["from_cache"] and cached["matmul_tflops"] == entry["matmul_tflops"]


def test_calibrate_without_torch_exits_2_with_the_install_command(tmp_path):
    blocked = tmp_path / "blocked" / "torch"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('No module named torch (blocked for this test)')\n")
    env = {**plugin_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path / "blocked"), str(REPO)]),
           "GPUBENCH_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_cli(["calibrate", "--device", "cpu", "--json", str(tmp_path / "c.json")], cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "needs torch" in proc.stderr and "pip install torch" in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "cache").exists()
    bad = run_cli(["calibrate", "--device", "tpu"], cwd=tmp_path, env=env)
    assert bad.returncode == 2 and "cpu, cuda, cuda:N" in bad.stderr


def test_datasheet_labels():
    assert datasheet_for("NVIDIA H100 80GB HBM3").label == "NVIDIA H100 SXM5 80GB"
    assert datasheet_for("NVIDIA H100 PCIe").tflops["bf16"] == 756.0
    assert datasheet_for("NVIDIA H200").bandwidth_gbs == 4800.0
    assert datasheet_for("NVIDIA A100-SXM4-80GB").tflops == {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}
    for other in ("NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-40GB", "AMD EPYC", None):
        assert datasheet_for(other) is None
    entry = {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "matmul_tflops": {"bf16": 742.05},
             "memory_bandwidth_gbs": 2680.0}
    console = Console(record=True, width=200)
    console.print(figures_table([cache.Calibration(entry, cache.cache_dir(), cached=True)]))
    text = console.export_text()
    assert "742" in text and "989.4 (datasheet: NVIDIA H100 SXM5 80GB)" in text and "75%" in text
    assert "3350 (datasheet: NVIDIA H100 SXM5 80GB)" in text and "80%" in text


@pytest.mark.gpu
def test_calibrate_cuda_through_the_cli(tmp_path):
    env = {**plugin_env(), "GPUBENCH_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "cal.json"
    proc = run_cli(["calibrate", "--device", "cuda", "--json", str(out)], cwd=tmp_path, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (entry,) = json.loads(out.read_text())
    tflops = entry["matmul_tflops"]
    assert entry["device"] == "cuda:0" and entry["key"]["gpu_uuid"] and set(tflops) <= {"fp32", "tf32", "fp16", "bf16"}
    assert tflops["bf16"] > tflops["fp32"] > 0 and entry["memory_bandwidth_gbs"] > 100
    if entry["datasheet"]:  # measured cannot beat the datasheet by more than clock noise
        for p, v in tflops.items():
            assert v <= 1.05 * entry["datasheet"]["tflops"][p], (p, v)
        assert entry["memory_bandwidth_gbs"] <= 1.05 * entry["datasheet"]["bandwidth_gbs"]


# --- MFU ---------------------------------------------------------------------------------------

def _ok_result(config: Config, flops: float = 1e9, rate: float = 2000.0) -> dict:
    return {"status": "ok", "config": config.to_dict(), "model": {"flops_per_sample": flops},
            "metrics": {"throughput": {"median": rate}}}


def test_mfu_arithmetic():
    peaks = {"cuda:0": {"device": "cuda:0", "device_name": "GPU", "matmul_tflops": {"bf16": 800.0, "fp32": 50.0}},
             "cpu": {"device": "cpu", "device_name": "CPU", "matmul_tflops": {"fp32": 0.5, "bf16": 1.0}}}
    m = mfu_metrics(_ok_result(Config("mlp", device="cuda", precision="amp-bf16", parallelism="ddp:2")), peaks)
    assert m["achieved_tflops"] == pytest.approx(2.0)  # 1e9 FLOPs x 2000 samples/s
    assert m["peak_tflops"] == 1600.0 and m["mfu"] == pytest.approx(2.0 / 1600)  # two GPUs
    assert m["peak"]["precision"] == "bf16" and m["peak"]["devices"] == 2 and m["peak"]["per_device_tflops"] == 800.0
    cpu = mfu_metrics(_ok_result(Config("mlp", precision="fp32", parallelism="ddp:2"), rate=100.0), peaks)
    assert cpu["peak_tflops"] == 0.5 and cpu["mfu"] == pytest.approx(0.1 / 0.5)  # ranks share the one CPU
    two_nodes = mfu_metrics(_ok_result(Config("mlp", parallelism="ddp:2", nnodes=2), rate=100.0), peaks)
    assert two_nodes["peak_tflops"] == 1.0 and two_nodes["peak"]["devices"] == 2  # one CPU per node
    no_peak = mfu_metrics(_ok_result(Config("mlp", device="cuda", precision="tf32")), peaks)
    assert no_peak == {"achieved_tflops": pytest.approx(2.0)}  # no tf32 peak measured: no mfu
    assert mfu_metrics(_ok_result(Config("mlp", device="cuda:1")), peaks) == {"achieved_tflops": pytest.approx(2.0)}
    assert mfu_metrics({**_ok_result(Config("mlp")), "status": "oom"}, peaks) is None


# --- batch_size = "max" -------------------------------------------------------------------------

def test_twin_comparisons_pair_only_results_that_trained_the_same_batch():
    from gpubench.results.frame import flatten
    from gpubench.runner.sweep import checkpointing_comparison, scaling_comparison

    def trained(config: Config, batch: int, peak: int, rate: float) -> dict:
        r = _ok_result(config, rate=rate)
        r["config_id"] = config.config_id
        r["metrics"]["memory"] = {"peak_allocated_bytes": peak}
        r["metrics"]["batch_search"] = {"max_batch": batch}
        return r

    base = Config("mlp", device="cuda", batch_size="max")
    plain = trained(base, 512, 70 << 30, 1000.0)
    ckpt = trained(replace(base, checkpointing="activations"), 2048, 70 << 30, 1500.0)
    ddp = trained(replace(base, parallelism="ddp:2"), 1024, 70 << 30, 3000.0)
    # each side's search found another batch: comparing them would not compare like with like
    assert checkpointing_comparison(ckpt, [plain]) is None and scaling_comparison(ddp, [plain]) is None
    same = trained(replace(base, checkpointing="activations"), 512, 35 << 30, 800.0)
    assert checkpointing_comparison(same, [plain])["memory_saving"] == pytest.approx(0.5)
    # the report places a config at the batch it trained, a pipeline config at its whole batch
    assert flatten(ckpt)["batch_trained"] == 2048
    pipe = _ok_result(Config("mlp", batch_size=128, parallelism="pipeline:2"))
    pipe["metrics"]["micro_batch_size"] = 32
    assert flatten(pipe)["batch_trained"] == 128


def test_ab_refuses_batch_size_max(tmp_path, write_suite):
    suite = write_suite('[defaults]\nframework = "fake"\nworkload = "fault"\nbatch_size = "max"\n')
    proc = run_cli(["ab", str(suite), "--baseline-python", sys.executable, "--candidate-python", sys.executable,
                    "--out", str(tmp_path / "runs")], cwd=tmp_path)
    assert proc.returncode == 2 and '"max" is not for gpubench ab' in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_batch_size_max_validation(write_suite):
    base = '[defaults]\nworkload = "mlp"\n'
    (c,) = load_suite(str(write_suite(base + 'batch_size = "max"\n'))).expand()
    assert c.batch_size == "max" and c.config_id == "mlp_depth2_width512-torch-cpu-bsmax-fp32-single"
    assert (c.max_batch_start, c.max_batch_limit) == (64, 65536)
    with pytest.raises(ValueError, match="resolved to a number"):
        c.samples_per_step  # noqa: B018 - "max" * 4 would silently be a string
    for bad in ('"huge"', "0", "true"):
        path = write_suite(base + f"batch_size = {bad}\n")
        with pytest.raises(InputError) as e:
            load_suite(str(path))
        assert str(path) in str(e.value) and "batch_size" in str(e.value) and '"max"' in str(e.value)
    suite = load_suite(str(write_suite(base))).with_overrides(["batch_size=16,max"])
    assert [c.batch_size for c in suite.expand()] == [16, "max"]
    with pytest.raises(InputError, match="max_batch_limit .* below max_batch_start"):
        load_suite(str(write_suite(base + 'batch_size = "max"\nmax_batch_start = 128\nmax_batch_limit = 64\n')))


def test_a_max_search_is_reused_and_no_fit_is_oom(tmp_path, monkeypatch):
    config = Config("mlp", batch_size="max")
    search = {"requested": "max", "start": 64, "limit": 65536, "max_batch": 256, "first_oom": 257, "stopped": "",
              "probes": []}
    monkeypatch.setattr("gpubench.runner.find_batch.find_max_batch", lambda *a: pytest.fail("searched again"))
    earlier = [{"config_id": config.config_id, "config_hash": config.config_hash, "metrics": {"batch_search": search}}]
    assert batch_search(config, earlier=earlier) is search
    # the same id with other search settings (max_batch_limit is not in the id) searches anew
    other = replace(config, max_batch_limit=128)
    assert other.config_id == config.config_id
    monkeypatch.setattr("gpubench.runner.find_batch.find_max_batch",
                        lambda c, limit, launcher: Search(c.config_id, 64, 128, "", []))
    assert batch_search(other, earlier=earlier)["limit"] == 128
    none_fit = {**search, "max_batch": None, "first_oom": 1, "probes": [{"batch_size": 1, "status": "oom"}]}
    r = run_at_max_batch(Job(config, 0), none_fit, tmp_path)
    assert r["status"] == "oom" and "not even batch 1" in r["reason"] and r["metrics"]["batch_search"] is none_fit
    stopped = {**none_fit, "first_oom": None, "stopped": "batch 64: timeout: no result",
               "probes": [{"batch_size": 64, "status": "timeout"}]}
    r = run_at_max_batch(Job(config, 0), stopped, tmp_path)
    assert r["status"] == "timeout" and "batch 64: timeout" in r["reason"]


MAX_SUITE = """
[defaults]
framework = "fake"
workload = "fault"
warmup_steps = 1
steps = 3
windows = 2
max_batch_start = 8
[matrix]
batch_size = [16, "max"]
"""


def test_a_run_resolves_max_and_reports_mfu(tmp_path, write_suite):
    suite = write_suite(MAX_SUITE)
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--repeats", "2"], cwd=tmp_path,
                   env=plugin_env(FAKE_MAX_BATCH="20"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    results = load_results(run_dir)
    (cal_file,) = (p for p in (cache.cache_dir().glob("calibration-cpu-*.json")))  # the test session's cache
    peak = json.loads(cal_file.read_text())["matmul_tflops"]["fp32"]
    for r in results:
        m = r["metrics"]
        assert r["status"] == "ok"
        assert m["achieved_tflops"] == pytest.approx(r["model"]["flops_per_sample"] * m["throughput"]["median"] / 1e12)
        assert m["peak_tflops"] == peak and m["mfu"] == pytest.approx(m["achieved_tflops"] / peak)
        assert m["peak"]["source"].startswith("measured") and m["peak"]["cache_file"] == str(cal_file)
    maxed = [r for r in results if r["config"]["batch_size"] == "max"]
    assert [r["config_id"] for r in maxed] == ["fault_mode0-fake-cpu-bsmax-fp32-single"] * 2
    for r in maxed:  # searched once (doubling from 8, then bisection), every repeat at the batch found
        s = r["metrics"]["batch_search"]
        assert (s["requested"], s["max_batch"], s["first_oom"], s["start"]) == ("max", 20, 21, 8)
        assert [p["batch_size"] for p in s["probes"]] == [8, 16, 32, 24, 20, 22, 21]
        assert r["metrics"]["micro_batch_size"] == r["metrics"]["samples_per_step"] == 20
    assert "fault_mode0-fake-cpu-bsmax-fp32-single (bs 20)" in proc.stdout

    report = tmp_path / "reports" / run_dir.name
    summary = (report / "summary.md").read_text()
    assert "| MFU |" in summary.splitlines()[4] and "TFLOP/s" in summary
    html = (report / "index.html").read_text()
    assert 'id="flops"' in html and "Peaks used" in html and "(bs 20)" in html and "batch max" in html
    csv = (report / "results.csv").read_text().splitlines()
    cols = csv[0].split(",")
    row = dict(zip(cols, csv[2].split(",")))
    assert row["batch_size"] == "max" and float(row["batch_trained"]) == 20 and float(row["mfu"]) > 0

    off = run_cli(["run", str(suite), "--out", str(tmp_path / "off"), "--set", "batch_size=16", "--no-calibrate",
                   "--no-report"], cwd=tmp_path, env=plugin_env())
    assert off.returncode == 0 and "peaks of" not in off.stdout
    (r,) = load_results(next((tmp_path / "off").iterdir()))
    assert r["metrics"]["achieved_tflops"] > 0 and "mfu" not in r["metrics"] and "peak" not in r["metrics"]
