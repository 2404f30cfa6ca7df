"""Compile settings and memory formats: validation, unsupported combinations, torch.compile
and channels-last on CPU against eager; CUDA graphs and Inductor's CUDA-graph mode on a GPU."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from gpubench.backends import get_backend
from gpubench.errors import InputError
from gpubench.suite import Config, parse_suite
from gpubench.workloads import WORKLOADS, get_workload
from gpubench.workloads.base import Flatten, Linear, Workload, WorkloadSpec
from gpubench.workloads.data import synthetic_batches
from tests.conftest import REPO, plain_env, run_cli

torch = pytest.importorskip("torch")


def test_settings_are_validated_and_named_in_the_id():
    suite = parse_suite({"defaults": {"workload": "cnn", "compile": "cuda-graph", "memory_format": "channels-last"}},
                        "s.toml")
    (config,) = suite.expand()
    assert config.config_id == "cnn-torch-cpu-bs64-fp32-single-compile=cuda-graph-memory_format=channels-last"
    for key, value in (("compile", "jit"), ("memory_format", "nhwc")):
        with pytest.raises(InputError) as e:
            parse_suite({"defaults": {"workload": "cnn", key: value}}, "s.toml")
        assert f"s.toml: defaults.{key}" in str(e.value) and repr(value) in str(e.value)
    with pytest.raises(InputError, match="torch-compile-reduce-overhead, torch-compile-max-autotune, cuda-graph"):
        parse_suite({"defaults": {"workload": "cnn", "compile": "inductor"}}, "s.toml")


@pytest.fixture
def flat_workload(monkeypatch):
    """A workload whose samples are 1-D, to which channels-last cannot apply."""
    monkeypatch.setitem(WORKLOADS, "flat", Workload("flat", "test: 1-D input", lambda: WorkloadSpec(
        "flat", (16,), 3, (Flatten(), Linear(3)))))


@pytest.mark.parametrize("settings, framework, expected", [
    ({"compile": "cuda-graph"}, "torch", "on CPU use none or torch-compile"),
    ({"compile": "cuda-graph", "device": "cuda", "data": "pipeline"}, "torch", "use data = device"),
    ({"compile": "cuda-graph", "device": "cuda", "precision": "amp-fp16"}, "torch", "GradScaler"),
    ({"compile": "cuda-graph", "device": "cuda", "parallelism": "ddp:2"}, "torch", "use single or grad-accum:N"),
    ({"compile": "cuda-graph", "device": "cuda", "checkpointing": "activations"}, "torch", "restores the RNG state"),
    ({"compile": "torch-compile", "device": "cuda", "parallelism": "dp:2"}, "torch", "use ddp:N"),
    ({"compile": "torch-compile-reduce-overhead"}, "torch", "on CPU it is the same as torch-compile"),
    ({"compile": "xla"}, "torch", "TensorFlow's XLA"),
    ({"compile": "torch-compile"}, "tensorflow", "PyTorch setting"),
    ({"compile": "cuda-graph", "device": "cuda"}, "tensorflow", "PyTorch setting"),
    ({"memory_format": "channels-last"}, "tensorflow", "always runs convolutions channels-last"),
    ({"memory_format": "channels-last", "workload": "flat"}, "torch", "flat takes a 1-D sample"),
])
def test_unsupported_combinations_say_why(flat_workload, settings, framework, expected):
    config = Config(**{"workload": "cnn", "framework": framework, **settings})
    assert expected in get_backend(framework).unsupported(config)


def test_best_is_each_frameworks_strongest_mode_its_config_allows():
    """compile = "best" becomes, as the suite expands, PyTorch's torch.compile (with CUDA graphs
    on a GPU), TensorFlow's XLA and JAX's jit (its none); a config no mode of its framework's
    list allows keeps none (dp:N refuses torch.compile), and a mode chosen twice is one config."""
    suite = parse_suite({"defaults": {"workload": "mlp", "compile": "best"},
                         "matrix": {"framework": ["torch", "tensorflow", "jax"], "device": ["cpu", "cuda"],
                                    "include": [{"framework": "torch", "device": "cuda", "parallelism": "dp:2"},
                                                {"framework": "jax", "compile": "none"}]}}, "s.toml")
    configs = suite.expand()
    chosen = {(c.framework, c.device, c.parallelism): c.compile for c in configs}
    assert len(configs) == len(chosen) == 7  # JAX's explicit none is its best: one config each
    assert chosen == {("torch", "cpu", "single"): "torch-compile",
                      ("torch", "cuda", "single"): "torch-compile-reduce-overhead",
                      ("tensorflow", "cpu", "single"): "xla", ("tensorflow", "cuda", "single"): "xla",
                      ("jax", "cpu", "single"): "none", ("jax", "cuda", "single"): "none",
                      ("torch", "cuda", "dp:2"): "none"}


def test_supported_combinations_pass_the_static_rules():
    torch_backend = get_backend("torch")
    for settings in ({"compile": "torch-compile"}, {"compile": "torch-compile-max-autotune"},
                     {"compile": "cuda-graph", "device": "cuda", "precision": "amp-bf16", "parallelism": "grad-accum:2"},
                     {"memory_format": "channels-last"}, {"memory_format": "channels-last", "workload": "mlp"}):
        assert torch_backend.unsupported(Config(**{"workload": "cnn", **settings})) is None, settings
    assert get_backend("tensorflow").unsupported(Config(workload="cnn", framework="tensorflow",
                                                               compile="xla")) is None


def _losses(config: Config, spec: WorkloadSpec, steps: int, n_batches: int = 4) -> tuple[np.ndarray, object]:
    trainer = get_backend("torch").build(spec, config, synthetic_batches(spec, config.batch_size, n_batches, seed=0))
    out = []
    for _ in range(steps):
        trainer.step()
        out.append(trainer.read_loss())
    return np.array(out), trainer


def test_torch_compile_gives_the_eager_losses_on_cpu():
    """Inductor on CPU (C++ via gcc) compiles forward and backward in the first step; the
    same SGD steps give the same losses, and nothing compiles after the first step."""
    from gpubench.measure.loop import run_loop

    spec = get_workload("mlp").spec(depth=1, width=32)
    base = Config(workload="mlp", batch_size=16, optimizer="sgd", lr=0.05, workload_params=(("depth", 1), ("width", 32)))
    eager, _ = _losses(base, spec, 6)
    compiled, trainer = _losses(replace(base, compile="torch-compile"), spec, 6)
    np.testing.assert_allclose(compiled, eager, rtol=1e-5)
    assert eager[-1] < eager[0]
    assert trainer.compile_events() >= 1  # the first step compiled
    info = trainer.describe()["compile"]
    assert info["setting"] == "torch-compile" and info["mode"] == "default" and info["backend"] == "inductor"
    # on the trainer that already compiled, the loop's first step compiles nothing: no compile_s
    again = run_loop(trainer, warmup_steps=1, steps=2, windows=1)
    assert (again.compile_events_first, again.recompiles) == (0, 0)
    # the loop on a fresh trainer in a fresh compiler (as in a config's worker process): its first
    # step compiles, nothing after it does
    import torch

    torch._dynamo.reset()
    fresh = get_backend("torch").build(spec, replace(base, compile="torch-compile"),
                                       synthetic_batches(spec, base.batch_size, 4, seed=0))
    raw = run_loop(fresh, warmup_steps=1, steps=3, windows=2)
    assert raw.compile_events_in_windows == 0 and raw.warmup_steps == 1
    assert raw.compile_events_first >= 1 and (raw.recompiles, raw.graph_breaks) == (0, 0)  # the compile costs


def test_channels_last_gives_the_contiguous_losses_on_cpu():
    spec = get_workload("cnn").spec().without_dropout()
    base = Config(workload="cnn", batch_size=8, optimizer="sgd", lr=0.01)
    contiguous, _ = _losses(base, spec, 4, n_batches=2)
    nhwc, trainer = _losses(replace(base, memory_format="channels-last"), spec, 4, n_batches=2)
    np.testing.assert_allclose(nhwc, contiguous, rtol=1e-4)
    conv = trainer.model[2]  # 32 -> 64 channels (the first conv has one input channel: both layouts agree)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
    assert trainer.x[1].is_contiguous(memory_format=torch.channels_last)
    # with one channel NCHW and NHWC are the same bytes; a 3-channel pool shows the layout
    from gpubench.backends.pytorch.compile import channels_last_pool

    pool = channels_last_pool(torch.arange(2 * 4 * 3 * 5 * 5.0).reshape(2, 4, 3, 5, 5))
    assert pool[1].is_contiguous(memory_format=torch.channels_last) and not pool[1].is_contiguous()
    assert torch.equal(pool, torch.arange(2 * 4 * 3 * 5 * 5.0).reshape(2, 4, 3, 5, 5))
    assert trainer.describe()["memory_format"] == "channels_last"


# --- on a GPU -----------------------------------------------------------------------------------

def _mlp(**settings) -> tuple[Config, WorkloadSpec]:
    params = (("depth", 2), ("width", 64))
    return (Config(**{"workload": "mlp", "device": "cuda", "batch_size": 32, "workload_params": params, **settings}),
            get_workload("mlp").spec(depth=2, width=64))


@pytest.mark.gpu
@pytest.mark.parametrize("settings", [{"optimizer": "sgd", "lr": 0.05}, {"optimizer": "adam"},
                                      {"optimizer": "adamw", "parallelism": "grad-accum:2"},
                                      {"optimizer": "adam", "precision": "amp-bf16"}])
def test_cuda_graph_gives_the_eager_losses(settings):
    """The captured step trains exactly like the eager one: the warm-up before capture is
    undone, and the graph walks the data pool in the same order (the pool has fewer batches
    than steps, so the counter wraps)."""
    config, spec = _mlp(**settings)
    eager, _ = _losses(config, spec, 10)
    graphed, trainer = _losses(replace(config, compile="cuda-graph"), spec, 10)
    np.testing.assert_allclose(graphed, eager, rtol=1e-4 if config.precision == "fp32" else 1e-2)
    assert graphed[-1] < graphed[0]
    assert trainer._step.graph is not None
    assert trainer.describe()["compile"]["setting"] == "cuda-graph"


@pytest.mark.gpu
def test_reduce_overhead_compiles_only_before_the_windows():
    from gpubench.measure.loop import run_loop

    config, spec = _mlp(optimizer="sgd", lr=0.05)
    eager, _ = _losses(config, spec, 6)
    compiled_config = replace(config, compile="torch-compile-reduce-overhead")
    compiled, _ = _losses(compiled_config, spec, 6)
    np.testing.assert_allclose(compiled, eager, rtol=1e-3)
    trainer = get_backend("torch").build(spec, compiled_config, synthetic_batches(spec, 32, 4, seed=0))
    raw = run_loop(trainer, warmup_steps=0, steps=5, windows=2)  # the trainer raises the warm-up itself
    assert raw.warmup_steps >= 3 and raw.compile_events_in_windows == 0
    assert not raw.diverged and raw.loss_last < raw.loss_first
    # the compile costs: the first step compiled the forward and backward, nothing after it, no break
    assert raw.compile_events_first >= 1 and (raw.recompiles, raw.graph_breaks) == (0, 0)


@pytest.mark.slow
def test_a_graph_break_is_counted_and_fails_the_gate(tmp_path, write_suite):
    """A user's model compiled as it is, then with a graph break added (tests/corpus/breaking.py,
    by an environment variable its factory reads): graph_breaks 0, then 1, the compile time and
    recompiles beside it, and ``compare --metric graph_breaks`` fails the second, one repeat a
    side (a count every repeat agrees on is compared exactly)."""
    suite = write_suite("""
name = "breaks"
[defaults]
workload = "breaking:mlp"
input_shape = [32]
compile = "torch-compile"
batch_size = 16
warmup_steps = 2
steps = 3
windows = 2
threads = 1
telemetry_interval_ms = 0
""")
    runs = {}
    for breaks in ("0", "1"):
        env = plain_env(PYTHONPATH=f"{REPO}:{REPO / 'tests' / 'corpus'}", GPUBENCH_TEST_BREAK=breaks)
        proc = run_cli(["run", str(suite), "--out", str(tmp_path / breaks), "--no-report", "--no-calibrate"],
                       cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (runs[breaks],) = (tmp_path / breaks).iterdir()
        (r,) = [json.loads(line) for line in (runs[breaks] / "results.jsonl").read_text().splitlines()]
        m = r["metrics"]
        assert (m["graph_breaks"], m["recompiles"]) == (int(breaks), 0), r["config_id"]
        assert m["compile_s"] == pytest.approx(m["cold_start_ms"] / 1000) and m["compile_s"] > 0
    gate = run_cli(["compare", str(runs["0"]), str(runs["1"]), "--metric", "graph_breaks"], cwd=tmp_path,
                   env=plain_env())
    assert gate.returncode == 1 and "regressed" in gate.stdout and "exact" in gate.stdout, gate.stdout + gate.stderr


@pytest.mark.gpu
def test_mnist_cnn_with_and_without_cuda_graph_ends_ok(tmp_path, write_suite):
    suite = write_suite("""
name = "graph"
[defaults]
workload = "cnn"
device = "cuda"
batch_size = 128
warmup_steps = 3
steps = 20
windows = 3
[matrix]
compile = ["none", "cuda-graph"]
memory_format = ["contiguous", "channels-last"]
precision = ["fp32", "amp-bf16"]
""")
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--no-report"], cwd=tmp_path, env=plain_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert len(results) == 8
    for r in results:
        assert r["status"] == "ok", (r["config_id"], r["reason"])
        assert r["metrics"]["loss"]["fell"]
        assert r["runtime"]["compile"]["setting"] == r["config"]["compile"]
        assert r["runtime"]["memory_format"] == r["config"]["memory_format"].replace("-", "_")
