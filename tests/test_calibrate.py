"""Device calibration (gpubench calibrate), its cache, MFU, and batch_size = "max"."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from gpubench.backends import backend_class
from gpubench.calibrate import RECALIBRATE, cache, kernel_label
from gpubench.calibrate.command import figures_table
from gpubench.calibrate.datasheet import datasheet_for
from gpubench.errors import InputError
from gpubench.measure.kernels import PLANS, HostClock, Kernel, run_kernel
from gpubench.runner.find_batch import Search, batch_search, run_at_max_batch
from gpubench.runner.job import Job
from gpubench.runner.mfu import mfu_metrics
from gpubench.suite import Config, load_suite
from tests.conftest import REPO, make_result, plugin_env, result_lines, run_cli


def fake_build(monkeypatch, framework, build):
    """As if ``framework`` were installed at ``build`` (None: not installed)."""
    monkeypatch.setattr(backend_class(framework), "package_build", classmethod(lambda cls: build))


# --- the cache, with a stand-in for the measuring child ----------------------------------------


class FakeMeasure:
    """Counts calls; returns what the child would print (figures made up for the cache tests)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, device: str) -> dict:
        self.calls += 1
        kernel = {"framework": "torch", "op": "linear", "shape": "512x512x512", "size": 512}
        return {"device": device, "device_name": "test cpu", "peak_tflops": {"fp32": 0.5 * self.calls, "bf16": 1.0},
                "peak_kernels": {"fp32": kernel, "bf16": kernel}, "memory_bandwidth_gbs": 10.0}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBENCH_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_cache_is_gpubench_cache_dir_else_the_xdg_cache_home(tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.delenv("GPUBENCH_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache.cache_dir() == Path.home() / ".cache" / "gpubench"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "gpubench"
    monkeypatch.setenv("GPUBENCH_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine"


def test_cache_miss_hit_corrupt_and_force(cache_dir):
    measure, warnings = FakeMeasure(), []
    first = cache.get_calibration("cpu", measure=measure, warn=warnings.append)  # miss: measured and written
    assert not first.cached and measure.calls == 1 and first.path.parent == cache_dir
    assert first.path.name.startswith("calibration-cpu-") and json.loads(first.path.read_text()) == first.entry
    assert first.entry["key"] == cache.calibration_key("cpu") and first.entry["peak_tflops"]["fp32"] == 0.5
    hit = cache.get_calibration("cpu", measure=measure, warn=warnings.append)
    assert hit.cached and measure.calls == 1 and hit.entry == first.entry and warnings == []

    first.path.write_text('{"cache_version": 1, "key": ')  # a truncated file
    rebuilt = cache.get_calibration("cpu", measure=measure, warn=warnings.append)
    assert not rebuilt.cached and measure.calls == 2 and rebuilt.entry["peak_tflops"]["fp32"] == 1.0
    (warning,) = warnings
    assert str(first.path) in warning and "unusable" in warning and "measuring again" in warning and "\n" not in warning
    assert json.loads(first.path.read_text()) == rebuilt.entry  # the rebuilt entry is on disk

    for broken in ({**rebuilt.entry, "peak_tflops": {"fp32": "fast"}}, {**rebuilt.entry, "key": {"other": 1}},
                   {**rebuilt.entry, "cache_version": 0}, [1, 2],
                   {k: v for k, v in rebuilt.entry.items() if k != "device"},
                   {**rebuilt.entry, "peak_kernels": {"fp32": rebuilt.entry["peak_kernels"]["fp32"]}}):
        first.path.write_text(json.dumps(broken))
        assert not cache.get_calibration("cpu", measure=measure, warn=warnings.append).cached
    assert measure.calls == 8 and len(warnings) == 7

    # a version-1 file (torch.mm-only peaks, as gpubench wrote them before) is measured again, with the warning
    old = {k: v for k, v in rebuilt.entry.items() if k not in ("peak_tflops", "peak_kernels")}
    first.path.write_text(json.dumps({**old, "cache_version": 1, "matmul_tflops": {"fp32": 0.03, "bf16": 0.0012}}))
    again = cache.get_calibration("cpu", measure=measure, warn=warnings.append)
    assert not again.cached and measure.calls == 9 and f"cache_version 1, expected {cache.CACHE_VERSION}" in warnings[-1]
    assert "matmul_tflops" not in json.loads(first.path.read_text())

    forced = cache.get_calibration("cpu", force=True, measure=measure, warn=warnings.append)
    assert not forced.cached and measure.calls == 10 and len(warnings) == 8


def test_cache_key_fields(cache_dir, monkeypatch):
    torch = pytest.importorskip("torch")
    build = backend_class("torch").package_build()  # read from torch/version.py without importing torch
    assert build["version"] == torch.__version__ and build["cuda"] == torch.version.cuda
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    key = cache.calibration_key("cpu")
    assert {"hostname", "cpu_model", "torch", "torch_cuda", "tensorflow", "tensorflow_dist", "cpu_affinity",
            "cpu_features", "cpu_native", "thread_env"} <= set(key)
    tf_build = backend_class("tensorflow").package_build()  # from its package metadata, without importing it
    if tf_build is not None:
        assert key["tensorflow"] == importlib.metadata.version(tf_build["dist"])
    else:
        assert key["tensorflow"] is None
    with monkeypatch.context() as m:
        fake_build(m, "tensorflow", {"version": "9.9.9", "dist": "tensorflow"})
        assert cache.cache_file(cache.calibration_key("cpu")) != cache.cache_file(key)  # another TensorFlow: anew
    with monkeypatch.context() as m:  # the same host name and CPU model with native bf16 (a VM moved): anew
        features = cache.cpu_features()
        m.setattr(cache, "cpu_features", lambda: {**features, "cpu_native": {"bf16": not features["cpu_native"]["bf16"],
                                                                            "fp16": features["cpu_native"]["fp16"]}})
        assert cache.cache_file(cache.calibration_key("cpu")) != cache.cache_file(key)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # fewer threads, other peaks: another cache file
    assert cache.cache_file(cache.calibration_key("cpu")) != cache.cache_file(key)
    gpus = [{"name": "GPU A", "uuid": "GPU-aaaa", "driver": "550.1"}, {"name": "GPU B", "uuid": "GPU-bbbb",
                                                                        "driver": "550.1"}]
    monkeypatch.setattr("gpubench.telemetry.nvml.gpu_inventory", lambda: (gpus, None))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    key = cache.calibration_key("cuda:0")
    assert (key["device"], key["gpu_name"], key["gpu_uuid"], key["driver"]) == ("cuda", "GPU B", "GPU-bbbb", "550.1")
    assert "cpu_affinity" not in key and cache.calibration_device("cuda") == "cuda:0"


def _check_best_of(entry: dict) -> None:
    """Each precision's peak is the best kernel's figure, and peak_kernels names that kernel."""
    kernels = entry["details"]["kernels"]
    for p, peak in entry["peak_tflops"].items():
        best = max((k for k in kernels if k["precision"] == p and k["tflops"]), key=lambda k: k["tflops"])
        assert peak == best["tflops"]
        assert entry["peak_kernels"][p] == {f: best[f] for f in ("framework", "op", "shape", "size")}
    for k in kernels:  # a kernel's figure is its best size's median block
        assert k["tflops"] == max(s["tflops"] for s in k["sizes"])
        assert all(len(s["blocks_tflops"]) == entry["plan"]["blocks"] for s in k["sizes"])


@pytest.mark.slow
def test_calibrate_cpu_through_the_cli(tmp_path):
    """Measures (--force: whatever the test session's cache holds) into the session's cache,
    where the runs of later tests find the peaks instead of measuring them again."""
    pytest.importorskip("torch")
    env = {**plugin_env(), "COLUMNS": "250"}
    out = tmp_path / "cal.json"
    proc = run_cli(["calibrate", "--device", "cpu", "--force", "--json", str(out)], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "measured now" in proc.stdout and "peak fp32 (TFLOP/s)" in proc.stdout
    (entry,) = json.loads(out.read_text())
    assert entry["device"] == "cpu" and not entry["from_cache"] and entry["datasheet"] is None
    assert set(entry["peak_tflops"]) == {"fp32", "bf16"} and min(entry["peak_tflops"].values()) > 0
    assert entry["memory_bandwidth_gbs"] > 0
    for p in ("fp32", "bf16"):  # the kernel that set each peak is in the table
        assert kernel_label(entry["peak_kernels"][p]) in proc.stdout
    ran = {(k["framework"], k["op"], k["precision"]) for k in entry["details"]["kernels"]}
    expected = {("torch", "linear", p) for p in ("fp32", "bf16")} | {("torch", "conv2d", p) for p in ("fp32", "bf16")}
    if backend_class("tensorflow").package_build() is not None:
        expected |= {("tensorflow", op, p) for op in ("matmul", "conv2d") for p in ("fp32", "bf16")}
        assert entry["frameworks"]["tensorflow"]["version"] == entry["key"]["tensorflow"]
        assert "kernels timed in torch" in proc.stdout and "tensorflow" in proc.stdout
    if backend_class("jax").package_build() is not None:
        expected |= {("jax", op, p) for op in ("matmul", "conv2d") for p in ("fp32", "bf16")}
        assert entry["frameworks"]["jax"]["version"] == entry["key"]["jax"]
    assert ran == expected
    _check_best_of(entry)
    again = run_cli(["calibrate", "--device", "cpu", "--json", str(out)], cwd=tmp_path, env=env)
    assert again.returncode == 0 and "from the cache" in again.stdout
    (cached,) = json.loads(out.read_text())
    assert cached["from_cache"] and cached["peak_tflops"] == entry["peak_tflops"]


@pytest.mark.slow
def test_a_framework_that_is_not_installed_is_skipped_with_the_reason(tmp_path):
    pytest.importorskip("torch")
    for name in ("tensorflow", "jax"):  # (JAX too: only PyTorch's kernels are left)
        blocked = tmp_path / "blocked" / name
        blocked.mkdir(parents=True)
        (blocked / "__init__.py").write_text(f"raise ImportError('No module named {name} (blocked for this test)')\n")
    env = {**plugin_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path / "blocked"), str(REPO)]),
           "GPUBENCH_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "250"}
    proc = run_cli(["calibrate", "--device", "cpu", "--json", str(tmp_path / "c.json")], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (entry,) = json.loads((tmp_path / "c.json").read_text())
    reason = entry["frameworks"]["tensorflow"]["unavailable"]
    assert "tensorflow is not installed" in reason and "blocked for this test" in reason
    assert f"cpu: tensorflow kernels not timed: {reason}" in proc.stdout
    assert {k["framework"] for k in entry["details"]["kernels"]} == {"torch"}
    assert {k["framework"] for k in entry["peak_kernels"].values()} == {"torch"}
    assert entry["key"]["tensorflow"] is None  # no TensorFlow package metadata beside the blocked one
    _check_best_of(entry)


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


def test_each_name_a_driver_reports_finds_its_own_datasheet_row():
    """Every name a row lists matches that row and no earlier one (the first match wins), in
    any case; the parts the table leaves out, their neighbours' names and a CPU match none."""
    from gpubench.calibrate.datasheet import DATASHEETS, NOT_IN_TABLE

    for sheet in DATASHEETS:
        assert sheet.names and sheet.source
        for name in sheet.names:
            assert datasheet_for(name) is sheet, (name, datasheet_for(name))
            assert datasheet_for(name.upper()) is sheet
        assert set(sheet.tflops) <= {"fp32", "tf32", "fp16", "bf16", "fp8"}
        # dense figures: fp16 is twice tf32 on every part that has both (the 2:4 sparse figures would be 4x)
        if "tf32" in sheet.tflops and "fp16" in sheet.tflops:
            assert sheet.tflops["fp16"] == pytest.approx(2 * sheet.tflops["tf32"], rel=0.02), sheet.label
    for other in [*NOT_IN_TABLE, "NVIDIA GH200 480GB", "NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 4090 Laptop GPU",
                  "Tesla V100S-PCIE-32GB", "NVIDIA L40", "NVIDIA GB200", "NVIDIA H100", "AMD EPYC", None]:
        assert datasheet_for(other) is None, other
    assert datasheet_for("NVIDIA H100 80GB HBM3").tflops["bf16"] == 989.4
    assert datasheet_for("NVIDIA H100 NVL").tflops["bf16"] == 835.5  # one GPU, not the pair
    assert "fp8" not in datasheet_for("NVIDIA A100-SXM4-80GB").tflops and "bf16" not in datasheet_for("Tesla T4").tflops


def test_calibrate_judges_the_measured_peaks_against_the_datasheet_row():
    from gpubench.calibrate.command import summary, verdict_lines

    entry = {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "peak_tflops": {"bf16": 742.05, "fp32": 30.0},
             "peak_kernels": {"bf16": {"framework": "torch", "op": "mm", "shape": "16384x16384x16384", "size": 16384}},
             "memory_bandwidth_gbs": 2680.0}
    cal = cache.Calibration(entry, cache.cache_dir(), cached=True)
    console = Console(record=True, width=250)
    console.print(figures_table([cal]))
    text = console.export_text()
    assert "742" in text and "989.4 (datasheet: NVIDIA H100 SXM5 80GB)" in text and "75%" in text
    assert "torch mm 16384x16384x16384" in text
    assert "3350 (datasheet: NVIDIA H100 SXM5 80GB)" in text and "80%" in text
    assert [line.split()[-2:] for line in text.splitlines() if "│" in line and "peak" in line] == [
        ["low", "│"], ["expected", "│"]]  # fp32 30 of 66.9 is low; bf16 75% as expected
    lines = verdict_lines(cal, power_limit_w=500.0)
    assert lines[0].startswith("cuda:0: its power limit is 500 W, below the 700 W")
    assert lines[1].startswith("cuda:0: peak fp32 (TFLOP/s) 30 is 45% of the datasheet's 66.9") and len(lines) == 2
    assert summary(cal)["verdicts"] == {"peak fp32 (TFLOP/s)": "low", "peak bf16 (TFLOP/s)": "as expected",
                                        "memory bandwidth (GB/s)": "as expected"}
    clean = {**entry, "peak_tflops": {"bf16": 742.05}}
    assert verdict_lines(cache.Calibration(clean, cache.cache_dir(), cached=True), power_limit_w=700.0) == [
        "cuda:0: every figure as expected against the datasheet (NVIDIA H100 SXM5 80GB)"]
    unknown = cache.Calibration({**entry, "device_name": "NVIDIA GeForce GTX 1080"}, cache.cache_dir(), cached=True)
    assert verdict_lines(unknown) == ["cuda:0: NVIDIA GeForce GTX 1080 is not in the datasheet table "
                                      "(docs/reference/datasheets.md): no verdict"]
    assert summary(unknown)["verdicts"] == {} and summary(unknown)["datasheet"] is None
    assert verdict_lines(cache.Calibration({**entry, "device": "cpu"}, cache.cache_dir(), cached=True)) == []


@pytest.mark.gpu
def test_calibrate_cuda_through_the_cli(tmp_path):
    env = {**plugin_env(), "GPUBENCH_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "cal.json"
    proc = run_cli(["calibrate", "--device", "cuda", "--json", str(out)], cwd=tmp_path, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (entry,) = json.loads(out.read_text())
    tflops = entry["peak_tflops"]
    assert entry["device"] == "cuda:0" and entry["key"]["gpu_uuid"] and set(tflops) <= {"fp32", "tf32", "fp16", "bf16"}
    assert {("torch", "mm"), ("torch", "linear"), ("torch", "conv2d")} <= {
        (k["framework"], k["op"]) for k in entry["details"]["kernels"]}
    _check_best_of(entry)
    assert tflops["bf16"] > tflops["fp32"] > 0 and entry["memory_bandwidth_gbs"] > 100
    verdicts = ("every figure as expected against the datasheet", "of the datasheet's", "not in the datasheet table")
    assert any(v in proc.stdout for v in verdicts), proc.stdout
    if entry["datasheet"]:  # measured cannot beat the datasheet by more than clock noise
        assert "above the datasheet" not in entry["verdicts"].values() and entry["datasheet"]["source"]
        for p, v in tflops.items():  # a precision the row has no figure for is not judged
            assert v <= 1.05 * entry["datasheet"]["tflops"].get(p, float("inf")), (p, v)
        assert entry["memory_bandwidth_gbs"] <= 1.05 * (entry["datasheet"]["bandwidth_gbs"] or float("inf"))


# --- MFU ---------------------------------------------------------------------------------------

def _ok_result(config: Config, flops: float = 1e9, rate: float = 2000.0, status: str = "ok"):
    r = make_result(config, rate, status)
    r.model = {"flops_per_sample": flops}
    return r


def test_mfu_arithmetic():
    peaks = {"cuda:0": {"device": "cuda:0", "device_name": "GPU", "peak_tflops": {"bf16": 800.0, "fp32": 50.0}},
             "cpu": {"device": "cpu", "device_name": "CPU", "peak_tflops": {"fp32": 0.5, "bf16": 1.0}}}
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
    assert mfu_metrics(_ok_result(Config("mlp"), status="oom"), peaks) is None
    # checkpointing: hardware FLOPs (the recomputed forward counted) against the same peaks
    ckpt = _ok_result(Config("mlp", device="cuda", precision="amp-bf16"))
    ckpt.model["hardware_flops_per_sample"] = 1.25e9
    hw = mfu_metrics(ckpt, peaks)
    assert hw["achieved_hardware_tflops"] == pytest.approx(2.5) and hw["hfu"] == pytest.approx(2.5 / 800)
    assert hw["mfu"] == pytest.approx(2.0 / 800) and "hfu_datasheet" not in hw  # "GPU" has no datasheet row
    low = {"cuda:0": {**peaks["cuda:0"], "peak_tflops": {"bf16": 2.2}}}
    above = mfu_metrics(ckpt, low)  # the hardware's 2.5 above the peak: no ceiling, for the model's 2.0 either
    assert above["peak_below_achieved"] is True and "hfu" not in above and "mfu" not in above
    assert above["achieved_tflops"] == pytest.approx(2.0) and above["peak_tflops"] == 2.2


def test_the_datasheet_mfu_is_against_the_dense_peak_of_the_gpu_the_result_names():
    def on(gpu: str, config: Config, **kw):
        r = _ok_result(config, **kw)
        r.env = {"frameworks": {"torch": {"devices": [{"name": "cpu", "model": "CPU"},
                                                      {"name": "cuda:0", "model": gpu}]}}}
        return r

    h100 = "NVIDIA H100 80GB HBM3"  # the SXM part, as torch names it
    ddp = mfu_metrics(on(h100, Config("mlp", device="cuda", precision="amp-bf16", parallelism="ddp:2")), {})
    assert ddp["datasheet_tflops"] == pytest.approx(2 * 989.4) and ddp["mfu_datasheet"] == pytest.approx(2.0 / 1978.8)
    sheet = ddp["datasheet"]
    assert (sheet["label"], sheet["precision"], sheet["devices"], sheet["dense"]) == ("NVIDIA H100 SXM5 80GB", "bf16",
                                                                                       2, True)
    assert "H100 Tensor Core GPU datasheet" in sheet["source"] and "mfu" not in ddp  # no calibration needed
    # beside a measured peak, each MFU against its own denominator
    measured = {"cuda:0": {"device": "cuda:0", "device_name": h100, "peak_tflops": {"bf16": 702.0}}}
    both = mfu_metrics(on(h100, Config("mlp", device="cuda", precision="amp-bf16")), measured)
    assert both["mfu"] == pytest.approx(2.0 / 702.0) and both["mfu_datasheet"] == pytest.approx(2.0 / 989.4)
    # above the datasheet (100 TFLOP/s of fp32 on a 66.9 part): no figure, the flag
    above = mfu_metrics(on(h100, Config("mlp", device="cuda"), flops=1e11, rate=1000.0), {})
    assert above["achieved_above_datasheet"] is True and "mfu_datasheet" not in above
    # a GPU the table does not hold, a precision its row lacks, and a CPU: no datasheet figure
    for result in (on("NVIDIA GeForce GTX 1080", Config("mlp", device="cuda")),
                   on("Tesla T4", Config("mlp", device="cuda", precision="amp-bf16")),
                   on(h100, Config("mlp"))):
        assert "datasheet_tflops" not in mfu_metrics(result, {})


def test_a_result_above_its_peak_gets_no_mfu_but_the_flag_and_the_peak():
    kernel = {"framework": "tensorflow", "op": "matmul", "shape": "1024x1024x1024", "size": 1024}
    peaks = {"cpu": {"device": "cpu", "device_name": "CPU", "peak_tflops": {"bf16": 0.0012, "fp32": 2.0},
                     "peak_kernels": {"bf16": kernel, "fp32": kernel}, "measured_at": "then", "cache_file": "f"}}
    above = mfu_metrics(_ok_result(Config("mlp", precision="amp-bf16"), flops=1e6, rate=14_000.0), peaks)
    assert above["achieved_tflops"] == pytest.approx(0.014) and "mfu" not in above  # 0.014 > 0.0012
    assert above["peak_below_achieved"] is True and above["peak_tflops"] == 0.0012
    assert above["peak"]["per_device_tflops"] == 0.0012 and above["peak"]["kernel"] == kernel
    at = mfu_metrics(_ok_result(Config("mlp"), flops=1e9, rate=2000.0), peaks)  # achieved == peak: 100%
    assert at["mfu"] == pytest.approx(1.0) and "peak_below_achieved" not in at


def test_peaks_of_and_no_peaks_lines(monkeypatch, capsys):
    from gpubench.runner.mfu import load_peaks

    def fake(device):
        if device == "cuda:0":
            raise cache.CalibrationError("no such device here; available: cpu", unavailable=True)
        entry = {"device": "cpu", "peak_tflops": {"fp32": 0.0327, "bf16": 0.0315},
                 "peak_kernels": {"fp32": {"framework": "tensorflow", "op": "conv2d"},
                                  "bf16": {"framework": "tensorflow", "op": "matmul"}}}
        return cache.Calibration(entry, cache.cache_dir(), cached=True)
    monkeypatch.setattr("gpubench.runner.mfu.get_calibration", fake)
    console = Console(record=True, width=300)
    peaks = load_peaks(["cpu", "cuda:0"], console)
    out = console.export_text()
    assert list(peaks) == ["cpu"] and "no peaks" not in out
    assert "peaks of cpu (cached): TFLOP/s fp32 0.0327 (tensorflow conv2d), bf16 0.0315 (tensorflow matmul)" in out
    err = capsys.readouterr().err  # the warning is on stderr, one line
    assert err.startswith("gpubench: warning: no peaks for cuda:0") and err.count("\n") == 1


def _flagged_results() -> list:
    """Three ok results against a stale CPU bf16 peak of 0.0012 TFLOP/s (torch.mm's, as before
    this calibration measured training kernels): one below it, one above, and an older result
    whose stored MFU is 411%."""
    peaks = {"cpu": {"device": "cpu", "device_name": "AMD EPYC", "peak_tflops": {"bf16": 0.0012, "fp32": 0.03},
                     "peak_kernels": {}}}
    out = []
    for config, rate in ((Config("mlp", precision="fp32"), 10_000.0), (Config("mlp", precision="amp-bf16"), 14_000.0),
                         (Config("mlp", precision="amp-bf16", batch_size=256), 14_000.0)):
        r = _ok_result(config, flops=1e6, rate=rate)
        r.with_metrics(step_time_ms={"median": 10.0, "cv": 0.01}, cold_start_ms=20.0, **mfu_metrics(r, peaks))
        out.append(r)
    out[2].metrics.pop("peak_below_achieved")
    out[2].metrics["mfu"] = 4.11  # written by an older gpubench
    return out


def test_the_summary_table_says_recalibrate_instead_of_an_mfu_above_100(tmp_path):
    from gpubench.runner.progress import summary_table

    console = Console(record=True, width=250)
    console.print(summary_table(_flagged_results()))
    text = console.export_text()
    assert "33.3%" in text  # fp32: 0.01 of 0.03 TFLOP/s
    assert text.count("above peak") == 3 and "411" not in text  # two cells and the caption
    assert "2 result(s) achieved more TFLOP/s than the calibrated peak" in text and RECALIBRATE in text
    assert not [v for v in re.findall(r"(\d+(?:\.\d+)?)%", text) if float(v) > 100]


def test_the_report_and_summary_md_say_recalibrate_instead_of_an_mfu_above_100(tmp_path):
    from gpubench.report.build import build_report

    run = tmp_path / "run_a"
    shutil.copytree(REPO / "tests" / "fixtures" / "run_a", run)
    results = _flagged_results()
    for r in results:
        r.run_id, r.env = "run_a", {}
        r.with_metrics(samples_per_step=64, step_times_ms=[10.0] * 4, noisy=False)
    (run / "results.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in results))
    report = build_report([run], tmp_path / "out")
    md = report.markdown.read_text()
    mfu_cells = [line.rstrip("|").split("|")[-1].strip() for line in md.splitlines() if line.startswith("| mlp") and "k/s \\[" in line]
    assert mfu_cells == ["33.3%", "above peak", "above peak"]
    assert "2 config(s) achieved more TFLOP/s than the calibrated peak" in md and f"recalibrate with {RECALIBRATE}" in md
    page = report.index.read_text()
    flops = page[page.index('id="flops"'):page.index('id="memory"')]
    assert flops.count(f"above the calibrated peak (0.0012 TFLOP/s): recalibrate with {RECALIBRATE}") == 2
    assert "MFU 33.3%" in flops and "411" not in flops and "1.17e+03%" not in flops


# --- the kernels, their budget, and the best of them -----------------------------------------

def _kernel(framework: str, op: str, precision: str, tflops: float | None, note: str = "") -> dict:
    return {"framework": framework, "op": op, "precision": precision, "tflops": tflops, "size": 512,
            "shape": "512x512x512" if tflops else None, "sizes": [], "note": note}


def test_combine_keeps_the_best_kernel_per_precision_across_frameworks():
    torch_out = {"device": "cpu", "device_name": "AMD EPYC", "framework": {"name": "torch", "version": "2.13"},
                 "kernels": [_kernel("torch", "linear", "fp32", 0.028), _kernel("torch", "conv2d", "fp32", 0.030),
                             _kernel("torch", "linear", "bf16", 0.004), _kernel("torch", "conv2d", "bf16", 0.0038)],
                 "memory_bandwidth_gbs": 11.0, "copy": {"gbs": 11.0}, "skipped": {}, "plan": {"blocks": 3},
                 "seconds": 3.0}
    tf_out = {"framework": {"name": "tensorflow", "version": "2.21.0"}, "seconds": 2.5,
              "kernels": [_kernel("tensorflow", "matmul", "fp32", 0.0325), _kernel("tensorflow", "conv2d", "fp32", 0.029),
                          _kernel("tensorflow", "matmul", "bf16", 0.0315), _kernel("tensorflow", "conv2d", "bf16", None,
                                                                                   "size 1: InvalidArgumentError: x")]}
    entry = cache.combine(torch_out, {"tensorflow": tf_out})
    assert entry["peak_tflops"] == {"fp32": 0.0325, "bf16": 0.0315}
    assert entry["peak_kernels"]["bf16"] == {"framework": "tensorflow", "op": "matmul", "shape": "512x512x512",
                                             "size": 512}
    assert len(entry["details"]["kernels"]) == 8 and entry["memory_bandwidth_gbs"] == 11.0
    assert entry["frameworks"]["tensorflow"] == {"name": "tensorflow", "version": "2.21.0", "seconds": 2.5}
    assert entry["skipped"] == {}  # a failed kernel costs nothing while another ran at its precision

    without = cache.combine(torch_out, {"tensorflow": {"unavailable": "tensorflow is not installed"}})  # a framework skipped
    assert without["peak_tflops"] == {"fp32": 0.030, "bf16": 0.004}
    assert without["peak_kernels"]["fp32"]["op"] == "conv2d" and without["peak_kernels"]["bf16"]["op"] == "linear"
    assert without["frameworks"]["tensorflow"] == {"unavailable": "tensorflow is not installed"}
    assert {k["framework"] for k in without["details"]["kernels"]} == {"torch"}

    only_failed = {**torch_out, "kernels": [_kernel("torch", "linear", "fp32", 0.028),
                                            _kernel("torch", "linear", "bf16", None, "size 256: RuntimeError: no")]}
    entry = cache.combine(only_failed, {"tensorflow": {"unavailable": "x"}})
    assert entry["peak_tflops"] == {"fp32": 0.028} and set(entry["peak_kernels"]) == {"fp32"}
    assert "no kernel ran (torch linear: size 256: RuntimeError: no)" in entry["skipped"]["bf16"]


def test_a_kernel_faster_than_the_datasheet_is_no_peak(capsys):
    """On a lent H100 the fp32 peak came from cuDNN's FFT convolution at 98 TFLOP/s by nominal
    FLOPs, 147% of the datasheet's 66.9: a figure no fp32 unit can reach. Such a kernel stays in
    the details with the reason and the peak is the best kernel within the datasheet."""
    torch_out = {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "framework": {"name": "torch"},
                 "kernels": [_kernel("torch", "mm", "fp32", 51.0), _kernel("torch", "conv2d", "fp32", 98.09),
                             _kernel("torch", "mm", "bf16", 702.0), _kernel("torch", "conv2d", "tf32", 600.0),
                             _kernel("torch", "mm", "fp16", 69.0)],
                 "memory_bandwidth_gbs": 3004.0, "skipped": {}}
    entry = cache.combine(torch_out, {"tensorflow": {"unavailable": "tensorflow is not installed"}})
    assert entry["peak_tflops"] == {"fp32": 51.0, "fp16": 69.0, "bf16": 702.0}  # tf32's only kernel was impossible
    assert entry["peak_kernels"]["fp32"]["op"] == "mm"
    conv = next(k for k in entry["details"]["kernels"] if k["op"] == "conv2d" and k["precision"] == "fp32")
    assert "98.09 TFLOP/s" in conv["not_a_peak"] and "66.9 (NVIDIA H100 SXM5 80GB)" in conv["not_a_peak"]
    assert "above the datasheet" in entry["skipped"]["tf32"]
    # 5% above the datasheet is clock noise, not an impossible figure; an unknown GPU has no limit
    near = {**torch_out, "kernels": [_kernel("torch", "mm", "fp32", 66.9 * 1.04)]}
    assert cache.combine(near, {"tensorflow": {"unavailable": "x"}})["peak_tflops"] == {"fp32": 66.9 * 1.04}
    unknown = {**torch_out, "device_name": "NVIDIA B300", "kernels": [_kernel("torch", "conv2d", "fp32", 98.09)]}
    assert cache.combine(unknown, {"tensorflow": {"unavailable": "x"}})["peak_tflops"] == {"fp32": 98.09}
    from gpubench.calibrate.command import framework_lines
    lines = framework_lines(cache.Calibration(entry, Path("x.json"), cached=True))
    assert any(line.startswith("cuda:0: torch conv2d 512x512x512 fp32 not taken as a peak: 98.09") for line in lines)


def test_measure_in_child_asks_jax_where_it_is_installed_and_goes_on_when_it_fails(monkeypatch):
    torch_out = {"device": "cpu", "framework": {"name": "torch"}, "kernels": [_kernel("torch", "linear", "fp32", 0.02)],
                 "memory_bandwidth_gbs": 10.0}
    jax_out = {"device": "cpu", "framework": {"name": "jax", "version": "0.10.2"},
               "kernels": [_kernel("jax", "matmul", "fp32", 0.03)], "seconds": 1.0}
    started = []

    def child(module, device, launcher):
        started.append(module)
        if module.endswith("jax.calibration"):
            if len(started) > 2:
                raise cache.CalibrationError("calibrating cpu (gpubench.backends.jax.calibration) failed (exit code 1): ")
            return jax_out
        return torch_out
    monkeypatch.setattr(cache, "run_child", child)
    fake_build(monkeypatch, "tensorflow", None)
    fake_build(monkeypatch, "jax", {"jax": "0.10.2", "jaxlib": "0.10.2"})
    entry = cache.measure_in_child("cpu")
    assert started == ["gpubench.backends.pytorch.calibration", "gpubench.backends.jax.calibration"]
    assert entry["peak_tflops"] == {"fp32": 0.03} and entry["peak_kernels"]["fp32"]["framework"] == "jax"
    assert entry["frameworks"]["jax"] == {"name": "jax", "version": "0.10.2", "seconds": 1.0}
    entry = cache.measure_in_child("cpu")  # its child failed: the peak is PyTorch's
    assert entry["frameworks"]["jax"]["unavailable"].startswith("its measurement failed: calibrating cpu")
    assert entry["peak_tflops"] == {"fp32": 0.02}
    key = cache.calibration_key("cpu")
    assert (key["jax"], key["jaxlib"]) == ("0.10.2", "0.10.2")  # another JAX: measured anew
    fake_build(monkeypatch, "jax", None)
    assert "jax" not in cache.calibration_key("cpu")  # without JAX, the key of a cache from before it


def test_measure_in_child_skips_tensorflow_where_it_is_missing_or_fails(monkeypatch):
    torch_out = {"device": "cpu", "framework": {"name": "torch"}, "kernels": [_kernel("torch", "linear", "fp32", 0.02)],
                 "memory_bandwidth_gbs": 10.0}
    started = []

    def child(module, device, launcher):
        started.append(module)
        if module.endswith("tensorflow.calibration"):
            raise cache.CalibrationError("calibrating cpu (gpubench.backends.tensorflow.calibration) failed (exit code -9): ")
        return torch_out
    monkeypatch.setattr(cache, "run_child", child)
    fake_build(monkeypatch, "tensorflow", None)
    fake_build(monkeypatch, "jax", None)
    entry = cache.measure_in_child("cpu")
    assert started == ["gpubench.backends.pytorch.calibration"]  # no TensorFlow child without TensorFlow
    assert entry["frameworks"]["tensorflow"] == {"unavailable": "tensorflow is not installed"}
    fake_build(monkeypatch, "tensorflow", {"version": "2.21.0", "dist": "tensorflow"})
    entry = cache.measure_in_child("cpu")  # its child failed: the calibration goes on without it
    assert started[1:] == ["gpubench.backends.pytorch.calibration", "gpubench.backends.tensorflow.calibration"]
    assert entry["frameworks"]["tensorflow"]["unavailable"].startswith("its measurement failed: calibrating cpu")
    assert entry["peak_tflops"] == {"fp32": 0.02} and entry["seconds"] >= 0


class _FakeClock(HostClock):
    """A call of size s takes s / 1000 seconds: the budget's arithmetic without any real timing."""

    def __init__(self) -> None:
        self.size = 0

    def time(self, fn, n, sync=None):
        return n * self.size / 1000.0


def test_a_kernel_stops_before_a_size_that_would_overrun_its_budget_and_keeps_sizes_that_ran():
    clock = _FakeClock()
    plan = replace(PLANS["cpu"], block_s=0.05, blocks=3, kernel_budget_s=1.0)

    def prepare(size):
        if size == 11:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory\nmore text")
        clock.size = size
        return (lambda: None), None
    # flops = size: a size's call time is predicted from the last size's, scaled by flops
    kernel = Kernel("torch", "linear", "bf16", (10, 20, 100, 1000), lambda s: float(s), str, prepare)
    out = run_kernel(kernel, plan, clock)
    # 10: 0.01 s a call, 5 calls a block; 20: 0.02 s; 100: 0.1 s a call, predicted (1 + 3) x 0.1 s; 1000: 4 s > 1 s
    assert [s["size"] for s in out["sizes"]] == [10, 20, 100]
    assert [s["calls_per_block"] for s in out["sizes"]] == [5, 2, 1]
    assert out["note"].startswith("sizes from 1000 skipped: about 4 s expected")
    assert out["tflops"] == pytest.approx(1000 / 1e12) and out["size"] == 10  # all equal: the first best
    failing = run_kernel(replace(kernel, sizes=(10, 11, 20)), plan, clock)
    assert [s["size"] for s in failing["sizes"]] == [10]
    assert failing["note"] == "size 11: RuntimeError: DefaultCPUAllocator: can't allocate memory"
    none = run_kernel(replace(kernel, sizes=(11,)), plan, clock)
    assert none["tflops"] is None and none["sizes"] == [] and none["shape"] is None


def test_the_torch_kernels_of_each_plan_and_a_tiny_real_run_of_the_cpu_ones():
    torch = pytest.importorskip("torch")
    from gpubench.backends.pytorch.calibration import torch_kernels
    from gpubench.measure.kernels import ConvShape

    gpu = torch_kernels(torch, "cuda:0", PLANS["cuda"], ["fp32", "tf32", "fp16", "bf16"])  # built, not run
    assert [(k.op, k.precision) for k in gpu[:3]] == [("mm", "fp32"), ("linear", "fp32"), ("conv2d", "fp32")]
    assert len(gpu) == 12 and gpu[-1].sizes == PLANS["cuda"].conv_batches
    tiny = replace(PLANS["cpu"], matmul_sizes=(16,), conv=ConvShape(4, 8, 6, 3), conv_batches=(2,), block_s=0.001,
                   blocks=2)
    out = [run_kernel(k, tiny, HostClock()) for k in torch_kernels(torch, "cpu", tiny, ["fp32", "bf16"])]
    assert [(k["op"], k["precision"]) for k in out] == [("linear", "fp32"), ("conv2d", "fp32"), ("linear", "bf16"),
                                                       ("conv2d", "bf16")]
    assert all(k["tflops"] > 0 and k["note"] == "" for k in out)
    assert out[0]["shape"] == "16x16x16" and out[1]["shape"] == "N=2 4->8 6x6 k3 NHWC"
    assert ConvShape(4, 8, 6, 3).flops(2) == 2 * 2 * 8 * 4 * 9 * 36


# --- batch_size = "max" -------------------------------------------------------------------------

def test_twin_comparisons_pair_only_results_that_trained_the_same_batch():
    from gpubench.results.frame import aggregate, flatten, results_frame
    from gpubench.results.twins import COMPARISONS, checkpointing, speedups

    def trained(config: Config, batch: int, peak: int, rate: float):
        return make_result(config, rate, memory={"peak_allocated_bytes": peak}, batch_search={"max_batch": batch})

    def twins(*results):
        frame = aggregate(results_frame(list(results)))
        parallel = next(c for c in COMPARISONS if c.axis == "parallelism")
        return checkpointing(frame).to_dict("records"), speedups(frame, parallel).to_dict("records")

    base = Config("mlp", device="cuda", batch_size="max")
    plain = trained(base, 512, 70 << 30, 1000.0)
    ckpt = trained(replace(base, checkpointing="activations"), 2048, 70 << 30, 1500.0)
    ddp = trained(replace(base, parallelism="ddp:2"), 1024, 70 << 30, 3000.0)
    # each side's search found another batch: comparing them would not compare like with like
    memory, (scaling,) = twins(plain, ckpt, ddp)
    assert memory == [] and scaling["speedup"] == 3.0 and pd.isna(scaling["scaling_efficiency"])
    same = trained(replace(base, checkpointing="activations"), 512, 35 << 30, 800.0)
    (saving,), _ = twins(plain, same)
    assert saving["memory_saving"] == pytest.approx(0.5)
    # the report places a config at the batch it trained, a pipeline config at its whole batch
    assert flatten(ckpt)["batch_trained"] == 2048
    pipe = make_result(Config("mlp", batch_size=128, parallelism="pipeline:2"), micro_batch_size=32)
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
    earlier = [make_result(config, status="oom", batch_search=search)]
    assert batch_search(config, earlier=earlier) == search
    # the same id with other search settings (max_batch_limit is not in the id) searches anew
    other = replace(config, max_batch_limit=128)
    assert other.config_id == config.config_id
    monkeypatch.setattr("gpubench.runner.find_batch.find_max_batch",
                        lambda c, limit, launcher: Search(c.config_id, 64, 128, "", []))
    assert batch_search(other, earlier=earlier)["limit"] == 128
    none_fit = {**search, "max_batch": None, "first_oom": 1, "probes": [{"batch_size": 1, "status": "oom"}]}
    r = run_at_max_batch(Job(config, 0), none_fit, tmp_path)
    assert r.status == "oom" and "not even batch 1" in r.reason and r.get("metrics", "batch_search") is none_fit
    stopped = {**none_fit, "first_oom": None, "stopped": "batch 64: timeout: no result",
               "probes": [{"batch_size": 64, "status": "timeout"}]}
    r = run_at_max_batch(Job(config, 0), stopped, tmp_path)
    assert r.status == "timeout" and "batch 64: timeout" in r.reason


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


@pytest.mark.slow
def test_a_run_resolves_max_and_reports_mfu(tmp_path, write_suite):
    suite = write_suite(MAX_SUITE)
    # a cache of its own: a test beside it that calibrates with --force would rewrite the session's
    own = tmp_path / "cache"
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--repeats", "2"], cwd=tmp_path,
                   env=plugin_env(FAKE_MAX_BATCH="20", GPUBENCH_CACHE_DIR=str(own), COLUMNS="200"))  # ids whole
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    results = result_lines(run_dir)
    cal_file = Path(results[0]["metrics"]["peak"]["cache_file"])
    assert cal_file.parent == own and cal_file.name.startswith("calibration-cpu-")
    peak = json.loads(cal_file.read_text())["peak_tflops"]["fp32"]
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
    assert "| MFU (measured peak) |" in summary.splitlines()[4] and "TFLOP/s" in summary
    assert "| MFU (datasheet peak) |" not in summary  # a CPU: no datasheet column
    html = (report / "index.html").read_text()
    assert 'id="flops"' in html and "Peaks used" in html and "(bs 20)" in html and "batch max" in html
    csv = (report / "results.csv").read_text().splitlines()
    cols = csv[0].split(",")
    row = dict(zip(cols, csv[2].split(",")))
    assert row["batch_size"] == "max" and float(row["batch_trained"]) == 20 and float(row["mfu"]) > 0

    off = run_cli(["run", str(suite), "--out", str(tmp_path / "off"), "--set", "batch_size=16", "--no-calibrate",
                   "--no-report"], cwd=tmp_path, env=plugin_env())
    assert off.returncode == 0 and "peaks of" not in off.stdout
    (r,) = result_lines(next((tmp_path / "off").iterdir()))
    assert r["metrics"]["achieved_tflops"] > 0 and "mfu" not in r["metrics"] and "peak" not in r["metrics"]
