"""Parallel strategies (issue #7): gradient accumulation, DDP, DataParallel, MirroredStrategy; find-batch."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from gpubench.options import Parallelism, parse_parallelism
from gpubench.errors import InputError
from gpubench.results.result import Outcome
from gpubench.suite import Config, load_suite
from gpubench.workloads import get_workload
from gpubench.workloads.data import make_batches, pool_batches, synthetic_batches
from tests.conftest import parallel_twins, plugin_env, result_lines, run_cli


def test_parallelism_values():
    assert parse_parallelism("single") == Parallelism("single", 1, (("single", 1),))
    assert parse_parallelism("grad-accum:4") == Parallelism("grad-accum", 4, (("grad-accum", 4),))
    for bad in ("grad-accum", "grad-accum:0", "grad-accum:x", "ddp", "warp:2", ""):
        with pytest.raises(ValueError, match="expected one of: single, grad-accum:N"):
            parse_parallelism(bad)
    c = Config(workload="mlp", batch_size=16, parallelism="grad-accum:4")
    assert (c.accum_steps, c.devices, c.samples_per_step) == (4, 1, 64)
    assert c.config_id == "mlp-torch-cpu-bs16-fp32-grad-accum4"  # no ':' in ids (they name files)
    assert Config(workload="mlp", batch_size=16).samples_per_step == 16


@pytest.mark.parametrize("device, parallelism, ordinals", [
    ("cpu", "ddp:2", ()), ("cuda", "single", (0,)), ("cuda:3", "single", (3,)), ("cuda:1", "grad-accum:4", (1,)),
    ("cuda", "ddp:4", (0, 1, 2, 3)), ("cuda", "dp:2", (0, 1)), ("cuda", "pipeline:2", (0, 1)),
    ("cuda", "mirrored:3", (0, 1, 2)), ("cuda", "multiworker:2", (0, 1)),
])
def test_the_gpus_a_config_trains_on(device, parallelism, ordinals):
    # what the NVML sampler watches: every rank's, replica's or stage's device of this node
    assert Config(workload="mlp", device=device, parallelism=parallelism).local_cuda_ordinals == ordinals


def test_a_bad_parallelism_in_a_suite_names_file_key_and_values(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[matrix]\nworkload = ["mlp"]\nparallelism = ["single", "grad-accum:-1"]\n')
    with pytest.raises(InputError) as e:
        load_suite(str(path)).expand()
    text = str(e.value)
    assert str(path) in text and "parallelism" in text and "grad-accum:N" in text


def test_accumulation_pool_holds_the_big_batches_samples_in_order():
    spec = get_workload("cnn").spec()
    big = make_batches(spec, 64, 0)
    small = make_batches(spec, 16, 0, group=4)
    assert small.n_batches == 4 * big.n_batches == 4 * pool_batches(spec, 64)
    assert np.array_equal(small.x.reshape(big.x.shape), big.x)
    assert np.array_equal(small.y.reshape(big.y.shape), big.y)


def _weights(trainer, framework):
    if framework == "torch":
        return [p.detach().numpy().copy() for p in trainer.model.parameters()]
    return [v.numpy().copy() for v in trainer.model.trainable_variables]


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
@pytest.mark.parametrize("optimizer, data", [("sgd", "device"), ("adam", "device"), ("sgd", "pipeline")])
def test_grad_accum_4_at_16_gives_the_update_of_single_at_64(framework, optimizer, data):
    pytest.importorskip(framework)
    from gpubench.backends import get_backend

    spec = get_workload("mlp").spec(depth=2, width=64).without_dropout()
    big = synthetic_batches(spec, 64, 3, seed=0)
    small = synthetic_batches(spec, 16, 12, seed=0)  # the same samples, in the same order
    single = Config(workload="mlp", framework=framework, batch_size=64, optimizer=optimizer, lr=0.01, data=data,
                    data_workers=0, workload_params=(("depth", 2), ("width", 64)))
    accum = replace(single, batch_size=16, parallelism="grad-accum:4")
    backend = get_backend(framework)
    a, b = backend.build(spec, single, big), backend.build(spec, accum, small)
    assert _weights(a, framework)[0].shape == _weights(b, framework)[0].shape
    for _ in range(3):
        a.step()
        b.step()
        # the loss of a step is the mean over its samples in both
        assert b.read_loss() == pytest.approx(a.read_loss(), rel=1e-5)
    # SGD: the same weights to float rounding. Adam divides by sqrt(v): where a gradient is
    # near zero, a rounding difference in it (the summation order differs) moves the update
    # by a visible fraction of lr, so its weights agree to 1% of one step (lr) instead
    atol = 1e-6 if optimizer == "sgd" else 1e-2 * single.lr
    for wa, wb in zip(_weights(a, framework), _weights(b, framework)):
        np.testing.assert_allclose(wb, wa, rtol=1e-4, atol=atol)
    assert b.describe()["grad_accum"] == 4 and a.describe()["grad_accum"] == 1


TINY_SUITE = """
[defaults]
warmup_steps = 1
steps = 3
windows = 2
telemetry_interval_ms = 0
[matrix]
workload = ["mlp"]
depth = [1]
width = [32]
batch_size = [8]
parallelism = {parallelism}
"""


def run_tiny(tmp_path, parallelism: str, defaults: str = "", **env: str):
    """Run TINY_SUITE with the given parallelism axis (and extra defaults): (exit code, run dir, results)."""
    (tmp_path / "s.toml").write_text(TINY_SUITE.format(parallelism=parallelism).replace("[matrix]",
                                                                                        f"{defaults}\n[matrix]"))
    proc = run_cli(["run", str(tmp_path / "s.toml"), "--out", str(tmp_path / "runs"), "--no-report"], cwd=tmp_path,
                   env=plugin_env(**env))
    (run_dir,) = list((tmp_path / "runs").iterdir())
    return proc, run_dir, result_lines(run_dir)


SGD = "-optimizer=sgd-lr=0.05"  # in the config ids of the shared run


@pytest.fixture(scope="module")
def parallel_run(tmp_path_factory):
    """One run of single, grad-accum:2, ddp:1, ddp:2 and pipeline:2 at batch 8, shared by the
    tests below (each config's worker imports PyTorch, and each run probes it: seconds each).
    SGD, so that the pipeline's losses can be compared with single's: Adam's first steps turn
    rounding differences in near-zero gradients into whole steps of lr."""
    pytest.importorskip("torch")
    proc, run_dir, results = run_tiny(tmp_path_factory.mktemp("parallel"),
                                      '["single", "grad-accum:2", "ddp:1", "ddp:2", "pipeline:2"]',
                                      defaults='optimizer = "sgd"\nlr = 0.05')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir, {r["config"]["parallelism"]: r for r in results}


@pytest.mark.slow
def test_run_records_batch_sizes_and_scaling_efficiency(parallel_run):
    run_dir, by_parallelism = parallel_run
    single, accum = by_parallelism["single"], by_parallelism["grad-accum:2"]
    assert single["config_id"] == "mlp_depth1_width32-torch-cpu-bs8-fp32-single" + SGD
    assert accum["config_id"] == "mlp_depth1_width32-torch-cpu-bs8-fp32-grad-accum2" + SGD
    m = accum["metrics"]
    assert (m["micro_batch_size"], m["accum_steps"], m["effective_batch_size"], m["samples_per_step"]) == (8, 2, 16, 16)
    assert m["devices"] == 1 and m["throughput_per_device"] == m["throughput"]["median"]
    twins = {t["config_id"]: t for t in parallel_twins(run_dir)}  # the report's comparisons with single
    assert (twins[accum["config_id"]]["baseline_id"], twins[accum["config_id"]]["devices"]) == (single["config_id"], 1)
    assert twins[accum["config_id"]]["scaling_efficiency"] == pytest.approx(
        m["throughput"]["median"] / single["metrics"]["throughput"]["median"])
    assert single["config_id"] not in twins
    # throughput counts every micro-batch: samples per step / median step time
    assert m["throughput"]["median"] == pytest.approx(16 * 1000.0 / m["step_time_ms"]["median"])
    assert json.loads((run_dir / "run.json").read_text())["suite"]["matrix"]["parallelism"] == [
        "single", "grad-accum:2", "ddp:1", "ddp:2", "pipeline:2"]


@pytest.mark.slow
def test_ddp_2_on_cpu_trains_two_ranks_with_identical_weights(parallel_run):
    run_dir, by_parallelism = parallel_run
    one, ddp = by_parallelism["ddp:1"], by_parallelism["ddp:2"]
    # ddp:1 also goes through torchrun and DDP: one rank, the single config's batch
    assert one["status"] == "ok" and one["metrics"]["devices"] == 1 and one["metrics"]["samples_per_step"] == 8
    assert one["runtime"]["distributed"] == "DistributedDataParallel(gloo, world_size=1)"
    assert len(one["metrics"]["ranks"]) == 1 and one["metrics"]["ranks_weights_identical"] is True
    assert ddp["status"] == "ok", ddp["reason"]
    assert ddp["config_id"] == "mlp_depth1_width32-torch-cpu-bs8-fp32-ddp2" + SGD
    m = ddp["metrics"]
    assert (m["devices"], m["samples_per_step"], m["micro_batch_size"]) == (2, 16, 8)
    assert m["throughput"]["median"] == pytest.approx(16 * 1000.0 / m["step_time_ms"]["median"])  # global
    assert m["throughput_per_device"] == pytest.approx(m["throughput"]["median"] / 2)
    single = by_parallelism["single"]
    assert {t["config_id"]: t for t in parallel_twins(run_dir)}[ddp["config_id"]]["scaling_efficiency"] == (
        pytest.approx(m["throughput"]["median"] / (2 * single["metrics"]["throughput"]["median"])))
    assert [r["rank"] for r in m["ranks"]] == [0, 1]
    assert m["ranks_weights_identical"] is True and m["ranks"][0]["weights_sha1"] == m["ranks"][1]["weights_sha1"]
    assert ddp["runtime"]["distributed"] == "DistributedDataParallel(gloo, world_size=2)"
    assert "torch.distributed" in (run_dir / ddp["log"]).read_text() or ddp["runtime"]["num_threads"] == 1


@pytest.mark.slow
def test_pipeline_2_trains_like_single_at_the_same_batch(parallel_run):
    run_dir, by_parallelism = parallel_run
    single, pipe = by_parallelism["single"], by_parallelism["pipeline:2"]
    assert pipe["status"] == "ok", pipe["reason"]
    m = pipe["metrics"]
    # two stages over the same batches of 8, in 4 micro-batches of 2: the same losses, step for
    # step, as single at 8 (the mlp has no dropout); the loss is the last stage's
    assert m["loss"]["windows"] == pytest.approx(single["metrics"]["loss"]["windows"], rel=1e-5)
    assert m["loss"]["first"] == pytest.approx(single["metrics"]["loss"]["first"], rel=1e-5)
    assert (m["devices"], m["samples_per_step"], m["micro_batch_size"], m["effective_batch_size"]) == (2, 8, 2, 8)
    assert m["throughput"]["median"] == pytest.approx(8 * 1000.0 / m["step_time_ms"]["median"])
    assert m["throughput_per_device"] == pytest.approx(m["throughput"]["median"] / 2)
    assert {t["config_id"]: t for t in parallel_twins(run_dir)}[pipe["config_id"]]["scaling_efficiency"] == (
        pytest.approx(m["throughput"]["median"] / (2 * single["metrics"]["throughput"]["median"])))
    assert [r["rank"] for r in m["ranks"]] == [0, 1] and "ranks_weights_identical" not in m  # stages differ
    runtime = pipe["runtime"]
    assert runtime["distributed"] == "ScheduleGPipe(gloo, stages=2, microbatches=4)"
    stages = runtime["pipeline"]["stages"]
    assert [s["modules"] for s in stages] == [["Flatten", "Linear", "ReLU"], ["Linear"]]
    assert sum(s["params"] for s in stages) == pipe["model"]["params"]
    assert sum(s["forward_flops_per_sample"] for s in stages) == pipe["model"]["forward_flops_per_sample"]


@pytest.mark.slow
def test_a_failing_rank_fails_the_config_and_leaves_no_process(tmp_path):
    """ddp:2, and pipeline:2, where stage 1 fails while stage 0 waits for it in the schedule's
    first step (one run for both: each run probes PyTorch)."""
    pytest.importorskip("torch")
    import psutil

    proc, run_dir, results = run_tiny(tmp_path, '["ddp:2", "pipeline:2"]', GPUBENCH_TEST_FAIL_RANK="1",
                                      GPUBENCH_PLUGINS="tests.plugins.failing_torch")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # an error makes run exit 1
    assert [r["config"]["parallelism"] for r in results] == ["ddp:2", "pipeline:2"]
    for r in results:
        assert r["status"] == "error", r["config_id"]
        assert r["reason"] == "rank 1: RuntimeError: injected failure on rank 1 (GPUBENCH_TEST_FAIL_RANK)"
        assert "injected failure" in r["traceback"]
    left = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    assert left == []


def test_ddp_unsupported_and_unavailable_combinations(tmp_path, write_suite):
    from gpubench.backends import get_backend

    # TensorFlow's rule (checked here, not through a run: the run would start a process that
    # imports TensorFlow only to probe it, and the CLI path of a rule is the same for both)
    tf_rule = get_backend("tensorflow").unsupported(Config(workload="mlp", framework="tensorflow",
                                                                  parallelism="ddp:2"))
    assert "DistributedDataParallel" in tf_rule
    suite = write_suite("""
[defaults]
steps = 1
windows = 1
[matrix]
workload = ["mlp"]
framework = ["torch"]
device = ["cuda", "cuda:1"]
parallelism = ["ddp:2"]
""")
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--no-report"], cwd=tmp_path)
    (run_dir,) = list((tmp_path / "runs").iterdir())
    by_id = {r["config_id"]: r for r in result_lines(run_dir)}
    measured = by_id["mlp_depth2_width512-torch-cuda-bs64-fp32-ddp2"]["status"] == "ok"  # a 2-GPU machine
    assert proc.returncode == (0 if measured else 1), proc.stdout + proc.stderr  # 1: nothing measured
    assert len(by_id) == 2
    pinned = by_id["mlp_depth2_width512-torch-cuda:1-bs64-fp32-ddp2"]
    assert pinned["status"] == "unsupported" and "use device = cuda" in pinned["reason"]
    assert by_id["mlp_depth2_width512-torch-cuda-bs64-fp32-ddp2"]["status"] in ("unavailable", "ok")  # ok on a 2-GPU machine


def test_dp_rules_and_batch_merging():
    from gpubench.backends import get_backend

    c = Config(workload="mlp", batch_size=16, parallelism="dp:2", device="cuda")
    assert (c.devices, c.samples_per_step, c.distributed) == (2, 32, False)
    torch_rules = get_backend("torch").unsupported
    assert "on CPU use ddp:N" in torch_rules(replace(c, device="cpu"))
    assert "use device = cuda" in torch_rules(replace(c, device="cuda:1"))
    assert torch_rules(c) is None
    assert "DataParallel" in get_backend("tensorflow").unsupported(replace(c, framework="tensorflow"))
    spec = get_workload("mlp").spec(depth=1, width=8)
    small = synthetic_batches(spec, 16, 6, seed=0)
    merged = small.merge(2)  # what DataParallel gets: the global batch of 2 x 16, in order
    assert merged.x.shape == (3, 32, *spec.input_shape)
    assert np.array_equal(merged.x[1], np.concatenate([small.x[2], small.x[3]]))
    assert np.array_equal(small.shard(1, 2).y, small.y[1::2])  # what ddp rank 1 gets


# test_mirrored_2_... is in test_distributed.py, sharing one TensorFlow run with multiworker:2.


# --- find-batch ----------------------------------------------------------------------------

def _probe_fitting(max_fit: int, other: dict[int, str] | None = None):
    seen: list[int] = []

    def probe(b: int) -> Outcome:
        seen.append(b)
        if other and b in other:
            return Outcome(status=other[b], reason="boom")
        return Outcome(status="ok" if b <= max_fit else "oom", metrics={"memory": {"peak_rss_bytes": b}})
    return probe, seen


def test_find_batch_search_doubles_then_bisects():
    from gpubench.runner.find_batch import search

    probe, seen = _probe_fitting(100)
    good, bad, stopped, probes = search(probe, 8, 1 << 20)
    assert (good, bad, stopped) == (100, 101, "")
    assert seen == [8, 16, 32, 64, 128, 96, 112, 104, 100, 102, 101]
    assert probes[0] == {"batch_size": 8, "status": "ok", "reason": "", "peak_allocated_bytes": None,
                         "peak_rss_bytes": 8}
    probe, seen = _probe_fitting(5)  # the start itself does not fit: search below it
    assert search(probe, 8, 1000)[:2] == (5, 6)
    probe, _ = _probe_fitting(0)  # nothing fits
    assert search(probe, 4, 1000)[:2] == (None, 1)
    probe, seen = _probe_fitting(10**9)  # everything up to the limit fits
    assert search(probe, 1, 64)[:2] == (64, None) and seen == [1, 2, 4, 8, 16, 32, 64]
    probe, _ = _probe_fitting(100, {64: "error"})
    good, bad, stopped, _ = search(probe, 8, 1000)
    assert (good, bad) == (32, None) and stopped == "batch 64: error: boom"
    # pipeline:N probes only batches its micro-batches divide: multiples of the unit
    probe, seen = _probe_fitting(100)
    assert search(probe, 6, 1000, unit=4)[:3] == (100, 104, "") and all(b % 4 == 0 for b in seen)
    assert seen[0] == 8  # the start rounded up to a multiple


def test_find_batch_limit_below_the_start_is_bad_input(tmp_path, write_suite):
    suite = write_suite('[defaults]\nframework = "fake"\nworkload = "fault"\nbatch_size = 64\n')
    proc = run_cli(["find-batch", str(suite), "--limit", "4"], cwd=tmp_path)
    assert proc.returncode == 2 and "--limit 4: below the batch the search starts from (64" in proc.stderr


def test_find_batch_command_with_fresh_processes(tmp_path, write_suite):
    import json

    suite = write_suite('[defaults]\nframework = "fake"\nworkload = "fault"\n[matrix]\nbatch_size = [8, 16]\n')
    out = tmp_path / "fb.json"
    proc = run_cli(["find-batch", str(suite), "--json", str(out)], cwd=tmp_path, env=plugin_env(FAKE_MAX_BATCH="20"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (s,) = json.loads(out.read_text())  # one search: batch sizes are what is searched
    assert s["config_id"] == "fault_mode0-fake-cpu-bs8-fp32-single"  # started at the smallest
    assert (s["max_batch"], s["first_oom"], s["stopped"]) == (20, 21, "")
    assert [p["batch_size"] for p in s["probes"]] == [8, 16, 32, 24, 20, 22, 21]
    assert {p["status"] for p in s["probes"]} == {"ok", "oom"}
    bad = run_cli(["find-batch", str(suite), "--set", "precision=fp17"], cwd=tmp_path)
    assert bad.returncode == 2 and "precision" in bad.stderr and "fp17" in bad.stderr


def test_find_batch_json_keeps_the_searches_done_when_stopped_midway(tmp_path, write_suite, monkeypatch):
    import json

    from rich.console import Console

    from gpubench.runner import find_batch_command
    from gpubench.runner.find_batch import Search

    suite = write_suite('[defaults]\nworkload = "mlp"\nbatch_size = 8\n[matrix]\nprecision = ["fp32", "amp-bf16"]\n')
    done = []

    def fake_search(config, limit, run_probe):
        if done:  # the second search: the command is stopped (a killed call, Ctrl-C)
            raise KeyboardInterrupt
        done.append(config.config_id)
        return Search(config.config_id, 64, 128, "", [{"batch_size": 8, "status": "ok"}])

    monkeypatch.setattr(find_batch_command, "find_max_batch", fake_search)
    out = tmp_path / "fb.json"
    with open(tmp_path / "log", "w") as log:
        code = find_batch_command.run_find_batch(find_batch_command.FindBatchRequest(str(suite), [], 1024, out,
                                                                                     tmp_path / "runs"), Console(file=log))
    assert code == 130  # stopped: the exit code of a Ctrl-C, the message on stderr (the CLI test names it)
    (s,) = json.loads(out.read_text())
    assert (s["config_id"], s["max_batch"], s["first_oom"]) == (done[0], 64, 128)


def test_dp_input_pipeline_feeds_the_merged_global_batch():
    # dp:N takes N x batch_size samples a step (scattered over its GPUs); the input pipeline
    # must hand over the same batches as device-resident data (DataParallel runs on the CPU here)
    import torch

    from gpubench.backends.pytorch.trainer import TorchTrainer

    spec = get_workload("mlp").spec(depth=1, width=8)
    merged = synthetic_batches(spec, 16, 6, seed=0).merge(2)
    for data in ("device", "pipeline"):
        config = Config(workload="mlp", batch_size=16, parallelism="dp:2", device="cpu", data=data, data_workers=0,
                        workload_params=(("depth", 1), ("width", 8)))
        trainer = TorchTrainer(spec, config, merged)
        x, y = trainer._next_batch()
        assert x.shape[0] == config.samples_per_step == 32, data
        assert torch.equal(y, torch.from_numpy(merged.y[0])), data
        trainer.close()


def test_dp_replicas_autocast_with_the_configs_dtype_in_their_own_threads():
    # DataParallel's replica threads enter autocast with only its on/off state; a new thread's
    # dtype is the device's default. AutocastModule sets the config's dtype in the replica.
    # Shown on the CPU (default bfloat16, asked for float16): the same mechanism as CUDA's
    # (default float16, asked for bfloat16).
    import threading

    import torch

    from gpubench.backends.pytorch.trainer import AutocastModule

    layer = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    out = {}

    def replica(name, module):
        with torch.autocast("cpu", enabled=True):  # what DataParallel's parallel_apply does
            out[name] = module(x).dtype

    with torch.autocast("cpu", dtype=torch.float16):  # the trainer's autocast, in the main thread
        for name, module in (("plain", layer), ("wrapped", AutocastModule(layer, "cpu", torch.float16))):
            t = threading.Thread(target=replica, args=(name, module))
            t.start()
            t.join()
    assert out == {"plain": torch.bfloat16, "wrapped": torch.float16}
