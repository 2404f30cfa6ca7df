"""scripts/gpu_targets.py: issue #8's GPU targets judged from hand-built results (no GPU)."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace

from gpubench.suite import Config
from tests.conftest import REPO, make_result

_spec = importlib.util.spec_from_file_location("gpu_targets", REPO / "scripts" / "gpu_targets.py")
targets = importlib.util.module_from_spec(_spec)
sys.modules["gpu_targets"] = targets  # its dataclasses look their module up
_spec.loader.exec_module(targets)


def result(config: Config, throughput: float, status: str = "ok"):
    return make_result(config, throughput, status)


R50 = Config(workload="resnet50", device="cuda", batch_size=256, precision="amp-bf16", memory_format="channels-last")
CNN = Config(workload="cnn", device="cuda", batch_size=128, precision="amp-bf16")
CAL = [{"device": "cpu", "matmul_tflops": {"bf16": 1.0}},
       {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "matmul_tflops": {"bf16": 790.0}}]


def verdicts(results, calibration=CAL):
    return {v.target.split(" >=")[0].split(" in [")[0].split(" (")[0]: v for v in targets.check(results, calibration)}


def test_every_target_passes_on_figures_above_the_bars():
    results = [result(R50, 3600.0), result(replace(R50, compile="cuda-graph"), 4700.0),
               result(replace(R50, precision="tf32"), 3600.0 / 2.5),
               result(replace(CNN, batch_size=1024), 1_200_000.0),
               result(CNN, 100_000.0), result(replace(CNN, compile="cuda-graph"), 350_000.0)]
    v = verdicts(results)
    assert {k: x.status for k, x in v.items()} == dict.fromkeys(v, "PASS") and len(v) == 6
    assert v["calibrate: bf16 matmul"].measured.startswith("790.0 TFLOP/s")
    assert v["ResNet-50 amp-bf16 over tf32"].measured.startswith("2.50x")
    assert "3.50x" in v["MNIST CNN amp-bf16 bs128 cuda-graph"].measured


def test_the_matmul_target_reads_the_best_matmul_kernel_of_a_calibration():
    kernels = [{"framework": "torch", "op": "mm", "precision": "bf16", "tflops": 760.0},
               {"framework": "torch", "op": "conv2d", "precision": "bf16", "tflops": 800.0},  # not a matmul
               {"framework": "tensorflow", "op": "matmul", "precision": "bf16", "tflops": 740.0},
               {"framework": "torch", "op": "linear", "precision": "fp16", "tflops": 900.0}]
    cal = [{"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "peak_tflops": {"bf16": 800.0},
            "details": {"kernels": kernels}}]
    v = verdicts([], calibration=cal)["calibrate: bf16 matmul"]
    assert v.status == "PASS" and v.measured.startswith("760.0 TFLOP/s")


def test_figures_below_the_bars_fail_and_absent_configs_are_missing():
    results = [result(R50, 3000.0), result(replace(R50, compile="torch-compile"), 4000.0),
               result(replace(R50, precision="tf32"), 1000.0),  # ratio 3.0: above the band
               result(replace(CNN, batch_size=1024), 900_000.0, status="ok"),
               result(CNN, 100_000.0), result(replace(CNN, compile="cuda-graph"), 250_000.0, status="oom")]
    v = verdicts(results, calibration=[{"device": "cuda:0", "matmul_tflops": {"bf16": 700.0}}])
    assert v["calibrate: bf16 matmul"].status == "FAIL"
    assert v["ResNet-50 amp-bf16 channels-last bs256 eager"].status == "FAIL"
    assert v["ResNet-50 amp-bf16 channels-last bs256 compiled or graph-captured"].status == "FAIL"
    assert v["ResNet-50 amp-bf16 over tf32"].status == "FAIL"
    assert v["MNIST CNN amp-bf16 bs1024 data on device"].status == "FAIL"
    assert v["MNIST CNN amp-bf16 bs128 cuda-graph"].status == "MISSING"  # the graph config did not end ok
    assert {x.status for x in verdicts([], calibration=[]).values()} == {"MISSING"}


def test_only_one_gpu_single_configs_count_and_the_ratio_pairs_twins():
    faster_on_two = replace(R50, parallelism="ddp:2")
    results = [result(R50, 3000.0), result(faster_on_two, 6000.0),
               result(replace(R50, precision="tf32"), 1250.0),
               result(replace(faster_on_two, precision="tf32"), 1000.0)]
    v = verdicts(results)
    eager = v["ResNet-50 amp-bf16 channels-last bs256 eager"]
    assert eager.status == "FAIL" and eager.measured.startswith("3,000 img/s")  # not ddp:2's 6,000
    assert v["ResNet-50 amp-bf16 over tf32"].measured.startswith("2.40x (3,000 / 1,250")


def test_a_run_directory_without_results_is_an_error(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        targets.main([str(tmp_path / "nope")])
    assert e.value.code == 2 and "no results.jsonl" in capsys.readouterr().err


def test_the_graph_target_is_judged_at_amp_bf16_and_shows_the_rest():
    fp32 = replace(CNN, precision="fp32")
    results = [result(CNN, 100_000.0), result(replace(CNN, compile="cuda-graph"), 400_000.0),
               result(fp32, 100_000.0), result(replace(fp32, compile="cuda-graph"), 130_000.0)]
    v = verdicts(results)["MNIST CNN amp-bf16 bs128 cuda-graph"]
    assert v.status == "PASS" and v.measured.startswith("4.00x (cnn-torch-cuda-bs128-amp-bf16-single)")
    assert "1.30x (cnn-torch-cuda-bs128-fp32-single, not judged)" in v.measured
    only_fp32 = verdicts(results[2:])["MNIST CNN amp-bf16 bs128 cuda-graph"]
    assert only_fp32.status == "MISSING" and "1.30x" in only_fp32.measured
