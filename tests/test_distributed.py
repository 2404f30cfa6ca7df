"""pipeline:N rules, TensorFlow's mirrored:N and multiworker:N, and multi-node runs (issue #7)."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import threading
from dataclasses import replace

import psutil
import pytest

from gpubench.backends import get_backend
from gpubench.cli import main as cli_main
from gpubench.results.result import Outcome
from gpubench.results.schema import result_problem
from gpubench.runner.nodes import Nodes
from gpubench.suite import Config
from gpubench.workloads import get_workload
from tests.conftest import make_result, parallel_twins, plugin_env, result_lines, run_cli

TINY = """
[defaults]
warmup_steps = 1
steps = 3
windows = 2
telemetry_interval_ms = 0
timeout_s = 120
optimizer = "sgd"
lr = 0.05
data_workers = 0
{defaults}
[matrix]
workload = ["mlp"]
depth = [1]
width = [32]
{matrix}
"""


def run_suite(tmp_path, write_suite, defaults: str, matrix: str, *flags: str, **env: str):
    """(exit code, run dir, results) of one run of TINY with the given extra keys."""
    suite = write_suite(TINY.format(defaults=defaults, matrix=matrix))
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--no-report", *flags], cwd=tmp_path,
                   env=plugin_env(**env))
    (run_dir,) = list((tmp_path / "runs").iterdir())
    return proc, run_dir, result_lines(run_dir)


def leftover(run_dir) -> list:
    return [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]


# --- rules and stage split (no processes) ----------------------------------------------------

def test_stage_split_balances_forward_flops_at_module_boundaries():
    from gpubench.backends.pytorch.pipeline import layer_costs, split_stages

    mlp = get_workload("mlp").spec()  # flatten, fc512, relu, fc512, relu, fc10
    assert layer_costs(mlp) == [0, 2 * 784 * 512, 0, 2 * 512 * 512, 0, 2 * 512 * 10]
    # a parameter-free layer stays with the layer before it; the first flatten with the first linear
    assert split_stages(layer_costs(mlp), 2) == [(0, 3), (3, 6)]
    assert split_stages(layer_costs(mlp), 3) == [(0, 3), (3, 5), (5, 6)]
    cnn = get_workload("cnn").spec()  # conv, relu, conv, relu, pool, dropout, flatten, fc128, relu, dropout, fc10
    assert split_stages(layer_costs(cnn), 2) == [(0, 7), (7, 11)]  # the conv stack | the classifier
    assert split_stages(layer_costs(cnn), 3) == [(0, 2), (2, 7), (7, 11)]
    assert split_stages([5, 5, 5, 5], 2) == [(0, 2), (2, 4)]
    assert split_stages([9, 1, 1, 1, 1], 2) == [(0, 1), (1, 5)]
    assert split_stages([3], 1) == [(0, 1)]
    # residual blocks cost their convolutions (batch norm, pooling: nothing), one block per module
    resnet = get_workload("resnet18").spec()
    costs = layer_costs(resnet)
    assert len(costs) == len(resnet.layers) and sum(costs) == resnet.forward_flops_per_sample
    assert all(c > 0 for c, layer in zip(costs, resnet.layers) if type(layer).__name__ == "Residual")
    with pytest.raises(ValueError, match="cannot split 2 layers into 3 stages"):
        split_stages([1, 1], 3)


def test_pipeline_and_multiworker_sizes_ids_and_rules():
    c = Config(workload="mlp", batch_size=16, parallelism="pipeline:2")
    # batch_size is the batch every stage processes per step, in pipeline_microbatches micro-batches
    assert (c.devices, c.replicas, c.samples_per_step, c.micro_batch_size, c.distributed) == (2, 1, 16, 4, True)
    assert c.config_id == "mlp-torch-cpu-bs16-fp32-pipeline2"
    assert replace(c, pipeline_microbatches=8, pipeline_schedule="1f1b").config_id == \
        "mlp-torch-cpu-bs16-fp32-pipeline2-pipeline_microbatches=8-pipeline_schedule=1f1b"
    assert replace(c, parallelism="ddp:2", pipeline_microbatches=8).config_id == "mlp-torch-cpu-bs16-fp32-ddp2"
    w = Config(workload="mlp", framework="tensorflow", batch_size=8, parallelism="multiworker:2")
    assert (w.devices, w.replicas, w.samples_per_step, w.micro_batch_size, w.distributed) == (2, 2, 16, 8, True)
    # across nodes: N processes per node
    two = replace(w, nnodes=2)
    assert (two.devices, two.samples_per_step, two.config_id) == (4, 32, w.config_id + "-nnodes=2")
    assert replace(c, nnodes=2).samples_per_step == 16 and replace(c, nnodes=2).devices == 4
    assert replace(c, parallelism="single", nnodes=2).topology_unsupported().startswith(
        "a multi-node run (--nnodes 2) runs distributed configs only")
    assert replace(c, nnodes=2).topology_unsupported() is None

    torch_rules, tf_rules = get_backend("torch").unsupported, get_backend("tensorflow").unsupported
    assert torch_rules(c) is None and tf_rules(w) is None
    assert "MultiWorkerMirroredStrategy" in torch_rules(replace(w, framework="torch"))
    assert "torch.distributed.pipelining" in tf_rules(replace(c, framework="tensorflow"))
    assert "not a multiple of 4" in torch_rules(replace(c, batch_size=10))
    assert "use device = cuda" in torch_rules(replace(c, device="cuda:1"))
    assert "use device = cuda" in tf_rules(replace(w, device="cuda:1"))
    assert "gradient scaler" in torch_rules(replace(c, device="cuda", precision="amp-fp16"))
    assert "data = device" in torch_rules(replace(c, data="pipeline"))
    assert "at least as many micro-batches as stages" in torch_rules(
        replace(c, parallelism="pipeline:4", pipeline_microbatches=2, pipeline_schedule="1f1b"))
    assert "fewer than the 8 stages" in torch_rules(replace(c, parallelism="pipeline:8", batch_size=8))
    # stages run eagerly: a compile setting or channels-last would be silently ignored
    assert "stages eagerly" in torch_rules(replace(c, compile="torch-compile"))
    assert "stages eagerly" in torch_rules(replace(c, workload="cnn", memory_format="channels-last"))
    assert "stages eagerly" in torch_rules(replace(c, checkpointing="activations"))
    # batch_size = "max" is checked once the search has resolved it, not before
    assert torch_rules(replace(c, batch_size="max")) is None


@pytest.mark.parametrize("argv, message", [
    (["--nnodes", "2"], "--master-addr: required with --nnodes 2"),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h"], "--node-rank: expected 0..1 (--nnodes 2), got 2"),
    (["--nnodes", "0"], "--nnodes: expected an integer >= 1, got 0"),
    (["--nnodes", "2", "--master-addr", "h", "--master-port", "70000"], "--master-port: expected a TCP port"),
    (["--master-addr", "h"], "--master-addr and --master-port are for multi-node runs"),
    (["--nnodes", "2", "--master-addr", "bad host"], "--master-addr: expected a host name or IP address"),
])
def test_bad_node_flags_are_one_line_errors_and_write_nothing(tmp_path, write_suite, capsys, argv, message):
    suite = write_suite(TINY.format(defaults="", matrix='parallelism = ["ddp:1"]'))
    assert cli_main(["run", str(suite), "--out", str(tmp_path / "runs"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpubench: error: {message}") and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_resume_cannot_join_a_multi_node_run(tmp_path, capsys):
    assert cli_main(["run", "--resume", str(tmp_path), "--nnodes", "2", "--master-addr", "h"]) == 2
    assert "--nnodes cannot be combined with --resume" in capsys.readouterr().err


# (pipeline:2 training like single: test_parallel.py, in its shared PyTorch run)


# --- mirrored:N and multiworker:N, in one TensorFlow run ---------------------------------------

@pytest.fixture(scope="module")
def tf_strategies(tmp_path_factory):
    """One TensorFlow run shared by the MirroredStrategy and MultiWorkerMirroredStrategy tests:
    single at the global batch of 16, and each strategy with 2 replicas of 8 (every process
    of it imports TensorFlow, seconds each, so the shared single config and probe count)."""
    pytest.importorskip("tensorflow")
    tmp = tmp_path_factory.mktemp("tf-strategies")
    (tmp / "s.toml").write_text(TINY.format(
        defaults='framework = "tensorflow"',
        matrix='batch_size = [16]\nparallelism = ["single"]\n'
               '[[matrix.include]]\nbatch_size = 8\nparallelism = "mirrored:2"\ndata = ["device", "pipeline"]\n'
               '[[matrix.include]]\nbatch_size = 8\nparallelism = "multiworker:2"'))
    proc = run_cli(["run", "s.toml", "--out", "runs", "--no-report"], cwd=tmp, env=plugin_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp / "runs").iterdir())
    return run_dir, {(r["config"]["parallelism"], r["config"]["data"]): r for r in result_lines(run_dir)}


@pytest.mark.slow
def test_mirrored_2_on_two_logical_cpus_trains_like_single_at_the_global_batch(tf_strategies):
    run_dir, results = tf_strategies
    single = results[("single", "device")]
    mirrored, piped = results[("mirrored:2", "device")], results[("mirrored:2", "pipeline")]
    for r in (mirrored, piped):
        assert r["status"] == "ok", r["reason"]
        m = r["metrics"]
        assert (m["devices"], m["samples_per_step"], m["micro_batch_size"]) == (2, 16, 8)
        assert r["runtime"]["distributed"].startswith("MirroredStrategy(") and "CPU:1" in r["runtime"]["distributed"]
        # two replicas of 8 over the same global batches of 16: the same losses as single at 16
        # (gradients all-reduced across replicas; no dropout in the mlp)
        assert m["loss"]["windows"] == pytest.approx(single["metrics"]["loss"]["windows"], rel=1e-5)
        assert m["loss"]["first"] == pytest.approx(single["metrics"]["loss"]["first"], rel=1e-5)
    # scaling efficiency is against single at the same per-device batch (8), not in this run
    assert mirrored["config_id"] not in {t["config_id"] for t in parallel_twins(run_dir)}
    assert piped["runtime"]["data"] == "tf.data(distributed)"


@pytest.mark.slow
def test_multiworker_2_trains_like_single_at_twice_the_batch(tf_strategies):
    run_dir, results = tf_strategies
    single, multi = results[("single", "device")], results[("multiworker:2", "device")]
    assert multi["status"] == "ok", multi["reason"]
    m = multi["metrics"]
    # two workers, each its shard of 8 of every global batch of 16: single's losses at 16
    assert m["loss"]["windows"] == pytest.approx(single["metrics"]["loss"]["windows"], rel=1e-5)
    assert (m["devices"], m["samples_per_step"], m["micro_batch_size"]) == (2, 16, 8)
    assert multi["runtime"]["distributed"] == "MultiWorkerMirroredStrategy(RING, workers=2, cluster=TF_CONFIG)"
    assert [r["rank"] for r in m["ranks"]] == [0, 1] and m["ranks_weights_identical"] is True
    assert leftover(run_dir) == []


def test_a_failing_worker_stops_the_other_workers(tmp_path, write_suite):
    # the fake numpy framework goes through the same launcher in a fraction of a second:
    # worker 1 fails after building, worker 0 hangs in its first step until the launcher stops it
    suite = write_suite('[defaults]\nframework = "fake"\nworkload = "fault"\nmode = 2\ntimeout_s = 120\n'
                        'telemetry_interval_ms = 0\n[matrix]\nparallelism = ["multiworker:2"]\n')
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--no-report"], cwd=tmp_path,
                   env=plugin_env(GPUBENCH_TEST_FAIL_RANK="1"))
    (run_dir,) = list((tmp_path / "runs").iterdir())
    (r,) = result_lines(run_dir)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert r["status"] == "error"
    assert r["reason"] == "rank 1: RuntimeError: injected failure on rank 1 (GPUBENCH_TEST_FAIL_RANK)"
    assert "injected failure" in r["traceback"] and r["duration_s"] < 60  # stopped, not timed out
    assert leftover(run_dir) == []


def _as_nodes(work: dict, port: int, host: str = "127.0.0.1") -> dict:
    """Run ``work[rank](nodes)`` for each rank of a 2-node layout on localhost, each node a
    thread; every node's return value (or the RuntimeError it raised)."""
    out: dict = {}

    def node(rank: int) -> None:
        try:
            out[rank] = work[rank](Nodes(2, rank, host, port))
        except RuntimeError as e:
            out[rank] = e

    threads = [threading.Thread(target=node, args=(r,)) for r in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out


def test_multiworker_rendezvous_gives_every_node_the_same_cluster():
    from gpubench.runner.ranks import cluster

    out = _as_nodes({1: lambda n: cluster(n, "job-a", 2), 0: lambda n: cluster(n, "job-a", 2)}, free_port())
    assert out[0] == out[1] and len(out[0]) == 4  # 2 workers on each of 2 nodes, node 0's first
    assert all(w.startswith("127.0.0.1:") for w in out[0]) and len(set(out[0])) == 4
    # nodes at different configs fail
    out = _as_nodes({1: lambda n: cluster(n, "job-b", 2), 0: lambda n: cluster(n, "job-a", 2)}, free_port())
    for rank in (0, 1):
        assert isinstance(out[rank], RuntimeError) and str(out[rank]) == "node 1 is at 'job-b', node 0 at 'job-a'"


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="no dual-stack IPv6 here")
def test_the_rendezvous_works_over_ipv6_and_names_ipv4_nodes_plainly():
    from gpubench.runner.nodes import _peer_host
    from gpubench.runner.ranks import cluster

    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            pass
    except OSError:
        pytest.skip("no IPv6 loopback here")
    out = _as_nodes({1: lambda n: cluster(n, "job-a", 1), 0: lambda n: cluster(n, "job-a", 1)}, free_port(), "::1")
    assert out[0] == out[1] and len(out[0]) == 2 and all(w.startswith("[::1]:") for w in out[0])
    assert _peer_host("::ffff:10.0.0.2") == "10.0.0.2" and _peer_host("fe80::1") == "fe80::1"
    assert _peer_host("10.0.0.2") == "10.0.0.2"


def _nodes_in_threads(plans: dict[int, list[tuple[str, int]]], port: int, timeout_s: float = 20) -> dict:
    """Each node runs the barrier for each (job, index) of its plan in turn."""
    from gpubench.runner.nodes import barrier

    return _as_nodes({rank: lambda n, plan=plan: [barrier(n, job, k, timeout_s) for job, k in plan]
                      for rank, plan in plans.items()}, port)


def test_the_node_barrier_realigns_nodes_that_skipped_different_configs():
    # node 1 skipped config 1 (say it was unavailable there): node 0's config 1 fails, both meet at 2
    out = _nodes_in_threads({0: [("b", 1), ("c", 2)], 1: [("c", 2)]}, free_port())
    assert out[1] == [None] and out[0][1] is None
    status, reason = out[0][0]
    assert status == "error" and "node 1 is at 'c', past node 0's 'b'" in reason and "nodes alike" in reason
    # node 0 skipped config 1: node 1's fails, both meet at 2
    out = _nodes_in_threads({0: [("c", 2)], 1: [("b", 1), ("c", 2)]}, free_port())
    assert out[0] == [None] and out[1][1] is None
    assert out[1][0][0] == "error" and "node 1 is at 'b', node 0 at 'c'" in out[1][0][1]
    # a node that never comes: the config times out on the other
    for alone in (0, 1):
        (result,) = _nodes_in_threads({alone: [("a", 0)]}, free_port(), timeout_s=1.0)[alone]
        assert result == ("timeout", "not every node reached this config within 1 s (timeout_s)")


# --- two nodes on localhost ----------------------------------------------------------------

def free_port() -> int:
    """A free port below Linux's ephemeral range (32768-60999), so that no outgoing
    connection takes it between now and the moment the rendezvous binds it."""
    for port in random.Random().sample(range(20000, 32000), 50):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


@pytest.mark.slow
def test_two_nodes_on_localhost_run_ddp_across_both(tmp_path, write_suite):
    pytest.importorskip("torch")
    suite = write_suite(TINY.format(defaults="", matrix='batch_size = [8]\nparallelism = ["single", "ddp:1"]'))
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "gpubench", "run", str(suite), "--out", str(tmp_path / f"n{r}"),
                               "--no-report", "--nnodes", "2", "--node-rank", str(r), "--master-addr", "127.0.0.1",
                               "--master-port", port], cwd=tmp_path, env=plugin_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    # on failure: each node's output and what it recorded (pytest would cut a long message short)
    recorded = [f"{f}: {f.read_text()[-1500:]}" for f in sorted(tmp_path.glob("n*/*/*.jsonl"))]
    assert [p.returncode for p in procs] == [0, 0], "\n".join([o[-1500:] for o in outs] + recorded)
    (run0,) = list((tmp_path / "n0").iterdir())
    (run1,) = list((tmp_path / "n1").iterdir())
    single, ddp = result_lines(run0)
    # single-process configs are skipped on every node, so that all reach each rendezvous together
    assert single["status"] == "unsupported" and "multi-node run (--nnodes 2)" in single["reason"]
    assert ddp["status"] == "ok", ddp["reason"]
    assert ddp["config_id"] == "mlp_depth1_width32-torch-cpu-bs8-fp32-ddp1-optimizer=sgd-lr=0.05-nnodes=2"
    m = ddp["metrics"]
    assert (m["devices"], m["nodes"], m["samples_per_step"]) == (2, 2, 16)  # 1 rank per node x 2 nodes
    assert ddp["runtime"]["distributed"] == "DistributedDataParallel(gloo, world_size=2)"
    assert [(r["rank"], r["node"]) for r in m["ranks"]] == [(0, 0), (1, 1)]
    assert m["ranks_weights_identical"] is True
    # node 1 records its own outcome of each config; the results are node 0's
    assert run1.name.endswith("-node1") and not (run1 / "results.jsonl").exists()
    lines = [json.loads(l) for l in (run1 / "node.jsonl").read_text().splitlines()]
    assert [(l["status"], l["node_rank"]) for l in lines] == [("unsupported", 1), ("ok", 1)]
    assert lines[1]["reason"] == "node 1: rank 1 finished; node 0 writes the result"
    assert [result_problem(l) for l in lines] == [None, None]  # an ok outcome without metrics has the right shape
    assert json.loads((run0 / "run.json").read_text())["args"]["nodes"]["nnodes"] == 2
    assert leftover(run0) == [] and leftover(run1) == []


# --- GPUs ----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("stages", [1, 2])
def test_pipeline_over_nccl(tmp_path, write_suite, stages):
    import torch

    proc, run_dir, (r,) = run_suite(tmp_path, write_suite, 'device = "cuda"',
                                    f'batch_size = [64]\nparallelism = ["pipeline:{stages}"]')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if torch.cuda.device_count() < stages:
        assert r["status"] == "unavailable" and f"needs {stages} CUDA devices" in r["reason"]
        return
    assert r["status"] == "ok", r["reason"]
    assert r["runtime"]["distributed"] == f"ScheduleGPipe(nccl, stages={stages}, microbatches=4)"
    assert r["runtime"]["step_timing"] == "cuda_events" and r["metrics"]["loss"]["fell"]
    assert r["metrics"]["memory"]["peak_allocated_bytes"] > 0


def test_reasons_with_brackets_print_as_text():
    # a gloo error names its source file in brackets, which rich would take for markup
    from rich.console import Console

    from gpubench.runner.progress import SweepDisplay, unmeasured_lines
    from gpubench.runner.job import Job

    reason = "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer"
    result = make_result(Config(workload="mlp"), status="error")
    result.reason, result.duration_s = reason, 1.0
    console = Console(record=True, width=300, force_terminal=False)
    SweepDisplay(console, 1).finished(0, Job(Config(workload="mlp"), 0), result)
    for line in unmeasured_lines([result]):
        console.print(line)
    assert console.export_text().count(reason) == 2


@pytest.mark.parametrize("parallelism, rank, status, code", [
    ("ddp:2", "0", "ok", 0), ("ddp:2", "1", "error", 1), ("ddp:2", "1", "ok", 0),
    ("single", "0", "ok", 0), ("single", "0", "error", 0),
])
def test_a_rank_leaves_without_interpreter_teardown(tmp_path, monkeypatch, parallelism, rank, status, code):
    # a gloo thread dropping a collective's last tensor during Py_FinalizeEx aborted a rank
    # (SIGABRT) after its outcome was written: a worker ends with os._exit instead, once its
    # outcome is written (a single process too: the teardown is no part of a config's cost)
    import logging

    from gpubench.runner import worker

    monkeypatch.setattr(logging, "shutdown", lambda: None)  # (this test's process goes on logging)

    config = Config(workload="mlp", parallelism=parallelism)
    (tmp_path / "job.json").write_text(json.dumps({"config": config.to_dict(), "repeat": 0}))
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(worker, "run_config", lambda config, profile, memory_history=None, counts=None, phase=None: (
        Outcome(status=status, reason="x"), None))
    exits = []
    monkeypatch.setattr(worker.os, "_exit", exits.append)
    assert worker.main([str(tmp_path)]) == code
    assert exits == [code]
    written = sorted(p.name for p in tmp_path.glob("result*.json"))
    assert written == (["result.json"] if rank == "0" else ["result-rank1.json"] if status == "error" else [])


@pytest.mark.slow
def test_a_language_model_under_mirrored_2_trains_like_single_at_the_global_batch(tmp_path):
    """gpt's targets are sequences: each replica's loss is the mean over its tokens, so two
    replicas of 4 (device-resident and tf.data) give single's losses at 8."""
    pytest.importorskip("tensorflow")
    (tmp_path / "s.toml").write_text(
        'name = "lm"\n[defaults]\nframework = "tensorflow"\nworkload = "gpt"\nlayers = 1\nd_model = 32\n'
        'heads = 2\nseq_len = 16\nvocab = 64\nwarmup_steps = 1\nsteps = 3\nwindows = 2\n'
        'telemetry_interval_ms = 0\noptimizer = "sgd"\nlr = 0.05\n[matrix]\nbatch_size = [8]\n'
        '[[matrix.include]]\nbatch_size = 4\nparallelism = "mirrored:2"\ndata = ["device", "pipeline"]\n')
    proc = run_cli(["run", "s.toml", "--out", "runs", "--no-report", "--no-calibrate"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    results = {(r["config"]["parallelism"], r["config"]["data"]): r for r in result_lines(run_dir)}
    single = results[("single", "device")]["metrics"]["loss"]
    for data in ("device", "pipeline"):
        r = results[("mirrored:2", data)]
        assert r["status"] == "ok", r["reason"]
        assert r["metrics"]["loss"]["windows"] == pytest.approx(single["windows"], rel=1e-5)
        assert r["metrics"]["loss"]["first"] == pytest.approx(single["first"], rel=1e-5)
