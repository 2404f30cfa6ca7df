"""The JAX backend: FLOPs by JAX's own cost analysis, batch norm and shortcuts trained step by
step as in PyTorch, and each of its settings changing how a step runs but not what it computes.
(Parameters, logits and first losses against the other frameworks: tests/test_identity.py.)"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("optax")
torch = pytest.importorskip("torch")

from gpubench.backends import get_backend  # noqa: E402
from gpubench.backends.jax.model import forward, init_state, to_params  # noqa: E402
from gpubench.suite import Config  # noqa: E402
from gpubench.workloads import get_workload  # noqa: E402
from gpubench.workloads.data import synthetic_batches  # noqa: E402


def spec_of(name, params=None):
    return get_workload(name).spec(**(params or {}))


def losses(framework, spec, config, batches, steps=6):
    from tests.test_identity import losses as first_losses

    return first_losses(framework, spec, config, batches, steps)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_forward_flops_are_jaxs_own_cost_analysis(name):
    """XLA's cost analysis counts every op: convolutions and matrix multiplies as the spec does
    (a multiply-add is 2), and also the bias adds, activations and pooling the spec leaves out.
    So it is at least the spec's count, and above it by those elementwise ops only."""
    spec = spec_of(name).without_dropout()
    params, state = to_params(spec.init_weights(0)), init_state(spec)
    x = jax.numpy.zeros((1, *spec.input_shape), jax.numpy.float32)
    cost = jax.jit(lambda p, x: forward(spec, p, state, x, train=False)[0]).lower(params, x).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops = cost["flops"]
    assert spec.forward_flops_per_sample <= flops <= 1.01 * spec.forward_flops_per_sample, (flops, spec.name)


@pytest.mark.parametrize("name, params", [("vit", {"layers": 2, "d_model": 64}),
                                          ("gpt", {"layers": 2, "d_model": 64, "seq_len": 32, "vocab": 100})])
def test_a_transformers_flops_are_jaxs_own_matrix_products(name, params):
    """ViT and GPT: the matrix products and the patch convolution JAX traces (attention's two
    products and the tied output head included; the token embedding is a lookup) are the spec's
    count exactly; XLA's cost analysis adds the softmax, layer norms, GELU (its erf) and residual
    adds the spec leaves out, so it is above it."""
    spec = spec_of(name, params)
    params, state = to_params(spec.init_weights(0)), init_state(spec)
    dtype = jax.numpy.int32 if spec.kind == "tokens" else jax.numpy.float32
    x = jax.numpy.zeros((1, *spec.input_shape), dtype)
    jaxpr = jax.make_jaxpr(lambda p, x: forward(spec, p, state, x, train=False)[0])(params, x).jaxpr
    from gpubench.backends.jax.native import matrix_flops

    assert matrix_flops(jaxpr) == spec.forward_flops_per_sample
    cost = jax.jit(lambda p, x: forward(spec, p, state, x, train=False)[0]).lower(params, x).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    assert cost["flops"] > spec.forward_flops_per_sample


def test_batch_norm_and_residuals_train_as_in_pytorch():
    """resnet18, step by step: batch statistics and the shortcut's gradients. (Its losses then
    drift apart as float32 rounding is amplified by 18 layers of small-batch normalisation:
    1e-5 at the third step, 4e-4 at the fourth, with lr 0.001; so three steps are compared.)"""
    spec = spec_of("resnet18")
    config = Config(workload="resnet18", batch_size=4, optimizer="sgd", lr=0.001)
    batches = synthetic_batches(spec, 4, 2, seed=0)
    np.testing.assert_allclose(losses("jax", spec, config, batches, 3), losses("torch", spec, config, batches, 3),
                               rtol=1e-4)


def test_settings_change_how_a_step_runs_not_what_it_computes():
    """Gradient accumulation over 2 micro-batches of 8 is one step of 16 (no batch norm); the
    input pipeline and activation checkpointing give the device-resident step's losses."""
    spec = spec_of("mlp")
    base = Config(workload="mlp", batch_size=16, optimizer="sgd", lr=0.05)
    whole = synthetic_batches(spec, 16, 2, seed=0)
    reference = losses("jax", spec, base, whole, 4)
    halves = synthetic_batches(spec, 8, 4, seed=0)  # the same samples, micro-batches of 8
    assert np.array_equal(halves.x.reshape(whole.x.shape), whole.x)
    accum = losses("jax", spec, Config(workload="mlp", batch_size=8, optimizer="sgd", lr=0.05,
                                       parallelism="grad-accum:2"), halves, 4)
    np.testing.assert_allclose(accum, reference, rtol=1e-5)
    for setting in (dict(data="pipeline"), dict(checkpointing="activations")):
        got = losses("jax", spec, Config(workload="mlp", batch_size=16, optimizer="sgd", lr=0.05, **setting), whole, 4)
        np.testing.assert_allclose(got, reference, rtol=1e-5, err_msg=str(setting))


def test_bf16_trains_and_says_how():
    spec = spec_of("cnn")
    trainer = get_backend("jax").build(spec, Config(workload="cnn", batch_size=16, precision="amp-bf16"),
                                       synthetic_batches(spec, 16, 2, seed=0))
    first = None
    for _ in range(8):
        trainer.step()
        first = trainer.read_loss() if first is None else first
    assert trainer.read_loss() < first
    info = trainer.describe()
    assert info["compute_dtype"] == "bfloat16" and info["step_timing"] == "window_mean"
    assert trainer.compile_events() == 1  # one XLA program, compiled once


def test_unsupported_settings_say_why():
    backend = get_backend("jax")
    reason = backend.unsupported(Config(workload="cnn", framework="jax", compile="xla"))
    assert "JAX always compiles its whole training step with XLA" in reason
    assert "dp:N" in backend.unsupported(Config(workload="cnn", framework="jax", parallelism="mirrored:2"))
    assert backend.unsupported(Config(workload="cnn", framework="jax", parallelism="dp:2")) is None
    assert backend.unsupported(Config(workload="mymodels:f", framework="jax")) is None  # a Flax factory
    assert "computes in its own dtype" in backend.unsupported(Config(workload="mymodels:f", framework="jax",
                                                                     precision="amp-bf16"))
    assert "is a torch model" in backend.unsupported(Config(workload="timm:test_vit", framework="jax"))


@pytest.mark.slow
def test_a_sweep_runs_jax_beside_pytorch_with_data_parallelism_on_host_devices(tmp_path):
    """Through the CLI, each config in its own worker: JAX and PyTorch train the same MLP at the
    same settings, JAX also over 2 host devices (dp:2), and each result says how it ran."""
    import json

    from tests.conftest import plain_env, result_lines, run_cli

    (tmp_path / "s.toml").write_text(
        '[defaults]\nworkload = "mlp"\nwarmup_steps = 1\nsteps = 3\nwindows = 2\nthreads = 1\nbatch_size = 32\n'
        'telemetry_interval_ms = 0\n[matrix]\nframework = ["torch", "jax"]\n'
        '[[matrix.include]]\nframework = "jax"\nparallelism = "dp:2"\n'
        '[[matrix.include]]\nframework = "jax"\ncompile = "xla"\n'
        '[[matrix.include]]\nframework = "jax"\nworkload = "flaxmodels:mlp"\ninput_shape = [64]\nnum_classes = 10\n'
        'parallelism = ["single", "dp:2"]\n')
    (tmp_path / "flaxmodels.py").write_text(FLAX_MLP)
    proc = run_cli(["run", "s.toml", "--out", "runs", "--no-report", "--no-calibrate"], cwd=tmp_path, env=plain_env(),
                   timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    by_id = {r["config_id"]: r for r in result_lines(run_dir)}
    torch_run = by_id["mlp_depth2_width512-torch-cpu-bs32-fp32-single-threads=1"]
    jax_run = by_id["mlp_depth2_width512-jax-cpu-bs32-fp32-single-threads=1"]
    dp = by_id["mlp_depth2_width512-jax-cpu-bs32-fp32-dp2-threads=1"]
    assert [torch_run["status"], jax_run["status"], dp["status"]] == ["ok", "ok", "ok"]
    assert jax_run["model"] == torch_run["model"]  # the same spec: the same parameters and FLOPs
    assert jax_run["metrics"]["loss"]["fell"] and dp["metrics"]["loss"]["fell"]
    assert jax_run["runtime"]["step_timing"] == "window_mean" and jax_run["runtime"]["optimizer_impl"] == "optax"
    assert len(dp["runtime"]["devices"]) == 2 and "Mesh of 2 devices" in dp["runtime"]["distributed"]
    assert dp["metrics"]["throughput"]["median"] > 0 and dp["config"]["batch_size"] == 32
    refused = by_id["mlp_depth2_width512-jax-cpu-bs32-fp32-single-compile=xla-threads=1"]
    assert refused["status"] == "unsupported" and "JAX always compiles" in refused["reason"]
    for parallel in ("single", "dp2"):  # a Flax factory from the suite's directory, on one device and on two
        own = by_id[f"flaxmodels.mlp-jax-cpu-bs32-fp32-{parallel}-threads=1"]
        assert own["status"] == "ok", own.get("reason")
        assert own["model"]["source"] == "factory" and own["model"]["flops_per_sample"] > 0
        assert own["model"]["origin"]["file"] == str((tmp_path / "flaxmodels.py").resolve())
    env = json.loads((run_dir / "run.json").read_text())["env"]["frameworks"]
    assert env["jax"]["version"] == jax.__version__


@pytest.mark.slow
def test_profile_traces_a_jax_config_and_tables_its_xla_instructions(tmp_path):
    import json

    from tests.conftest import plain_env, run_cli

    (tmp_path / "p.toml").write_text('[defaults]\nworkload = "cnn"\nframework = "jax"\nbatch_size = 8\nthreads = 1\n'
                                     'warmup_steps = 1\nsteps = 2\nwindows = 1\ntelemetry_interval_ms = 0\n')
    proc = run_cli(["profile", "p.toml", "--out", "prof", "--steps", "2", "--no-report"], cwd=tmp_path,
                   env=plain_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (config_dir,) = (tmp_path / "prof").glob("*/profile/cnn-jax-cpu-bs8-fp32-single-threads=1")
    trace = (config_dir / "trace.json").read_text()
    assert trace.count('"gpubench step') >= 2  # each profiled step is a range in the Perfetto trace
    assert list((config_dir / "jax").glob("plugins/profile/*/*.xplane.pb"))
    rows = json.loads((config_dir / "top_ops.json").read_text())
    assert rows and all(r["calls"] >= 2 and r["self_cpu_ms"] > 0 for r in rows)
    assert not any(r["name"].startswith(("ThunkExecutor::", "ThreadpoolListener::", "end: ")) for r in rows)
    assert "its phases cannot be timed apart" in proc.stdout


@pytest.mark.slow
def test_fp16_loss_scaling_follows_gradscalers_rule():
    """A step whose scaled gradients overflow is skipped (the weights and the optimizer state
    stay; batch norm's running statistics keep the forward's update, as under GradScaler) and
    halves the scale; finite steps update and count towards growing it."""
    from gpubench.backends.jax.trainer import JaxTrainer

    spec = spec_of("resnet18")
    trainer = JaxTrainer(spec, Config(workload="resnet18", batch_size=4, precision="amp-fp16", optimizer="sgd"),
                         synthetic_batches(spec, 4, 2, seed=0))
    assert float(trainer._carry["scale"]) == 2.0**16
    trainer._carry = {**trainer._carry, "scale": jax.numpy.asarray(1e38, jax.numpy.float32)}  # fp16 overflows
    before = {k: jax.tree_util.tree_map(np.asarray, trainer._carry[k]) for k in ("params", "bn")}
    trainer.step()
    after = trainer._carry
    assert float(after["scale"]) == pytest.approx(0.5e38, rel=1e-6) and int(after["good"]) == 0
    for a, b in zip(jax.tree_util.tree_leaves(before["params"]), jax.tree_util.tree_leaves(after["params"])):
        assert np.array_equal(a, np.asarray(b))
    bn_before, bn_after = jax.tree_util.tree_leaves(before["bn"]), jax.tree_util.tree_leaves(after["bn"])
    assert any(not np.array_equal(a, np.asarray(b)) for a, b in zip(bn_before, bn_after))
    trainer._carry = {**trainer._carry, "scale": jax.numpy.asarray(1024.0, jax.numpy.float32)}
    trainer.step()
    assert float(trainer._carry["scale"]) == 1024.0 and int(trainer._carry["good"]) == 1
    assert np.isfinite(trainer.read_loss())


DP_SCRIPT = """
import sys
import numpy as np
from gpubench.backends import get_backend
from gpubench.suite import Config
from gpubench.workloads import get_workload
from gpubench.workloads.data import synthetic_batches

spec = get_workload("cnn").spec().without_dropout()
batches = synthetic_batches(spec, 16, 2, seed=0)
backend = get_backend("jax")
out = {}
for parallelism in ("dp:2", "single"):
    config = Config(workload="cnn", framework="jax", batch_size=16 if parallelism == "single" else 8,
                    parallelism=parallelism, optimizer="sgd", lr=0.05)
    trainer = backend.build(spec, config, batches)
    losses = []
    for _ in range(4):
        trainer.step()
        losses.append(trainer.read_loss())
    out[parallelism] = np.array(losses)
    print(parallelism, len(trainer.devices), trainer.x.sharding.shard_shape(trainer.x.shape), losses)
np.testing.assert_allclose(out["dp:2"], out["single"], rtol=1e-5)
"""


def test_dp_over_two_host_devices_trains_as_one_device_on_the_global_batch(tmp_path):
    """dp:2 splits each global batch of 16 over two host devices (8 each), the parameters
    replicated: the same losses as one device taking the 16 at once (a fresh process: JAX's host
    devices are set before it starts)."""
    import subprocess
    import sys

    from tests.conftest import plain_env

    (tmp_path / "dp.py").write_text(DP_SCRIPT)
    proc = subprocess.run([sys.executable, "dp.py"], cwd=tmp_path, env=plain_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dp:2 2 (2, 8, 1, 28, 28)" in proc.stdout and "single 1 (2, 16, 1, 28, 28)" in proc.stdout


FIXTURE_TEST = """
def test_dp(gpubench_benchmark):
    step = gpubench_benchmark(workload="mlp", framework="jax", parallelism="dp:2", batch_size=8, threads=1,
                              steps_per_round=2, rounds=2, warmup_rounds=1)
    assert step.trainer.x.shape[1] == 16  # a global batch: 8 on each of the 2 devices
    assert step.samples_per_round == 2 * 16
    print("THROUGHPUT", step.throughput)
"""


def test_the_fixture_feeds_dp_the_global_batch_it_counts(tmp_path):
    """gpubench_benchmark with dp:N takes the worker's pool (N x batch_size per step), so the
    samples it counts per round are the samples trained."""
    import subprocess
    import sys

    from tests.conftest import plain_env

    (tmp_path / "test_dp.py").write_text(FIXTURE_TEST)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_dp.py",
                           "--rootdir", str(tmp_path)], cwd=tmp_path, env=plain_env(), capture_output=True, text=True,
                          timeout=300)
    assert "1 passed" in proc.stdout, proc.stdout + proc.stderr


FLAX_MLP = """
import flax.linen as nn


def mlp(width=64, classes=10):
    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            x = nn.relu(nn.Dense(width)(x.reshape(x.shape[0], -1)))
            x = nn.Dropout(0.1, deterministic=not train)(x)
            return nn.Dense(classes)(x)

    return MLP()
"""


def test_a_flax_factory_trains_with_its_own_state_and_counted_flops(monkeypatch, tmp_path):
    """The example project's Flax module: built from the suite's settings, its parameters and
    FLOPs counted (XLA's cost analysis of the training step), its batch statistics carried as
    state and updated in training. A Flax MLP with dropout learns the synthetic task."""
    pytest.importorskip("flax")
    from tests.conftest import REPO

    monkeypatch.syspath_prepend(str(REPO / "examples" / "own-model"))
    config = Config(workload="mymodels:flax_convnet", framework="jax", batch_size=8, optimizer="sgd", lr=0.05,
                    input_shape=(16, 16, 3), num_classes=10, workload_params=(("width", 8),))
    backend = get_backend("jax")
    assert backend.unsupported(config) is None
    native = backend.native(config)
    facts = native.facts
    assert facts["params"] == 3 * 3 * 3 * 8 + 8 + 2 * 8 + 8 * 10 + 10  # conv, batch norm's scale and bias, dense
    assert facts["flops_per_sample"] > 2 * 16 * 16 * 3 * 3 * 3 * 8  # at least the convolution's forward
    assert facts["num_classes"] == 10 and facts["input_shape"] == [16, 16, 3]
    assert facts["origin"]["file"].endswith("mymodels.py") and "XLA's cost analysis" in facts["flops_counted_by"]
    trainer = backend.build(native, config, native.make_batches(8, 1))
    stats_before = [np.asarray(a) for a in jax.tree_util.tree_leaves(trainer._carry["bn"])]
    for _ in range(2):
        trainer.step()
    stats_after = [np.asarray(a) for a in jax.tree_util.tree_leaves(trainer._carry["bn"])]
    assert stats_before and any(not np.array_equal(a, b) for a, b in zip(stats_before, stats_after))
    assert np.isfinite(trainer.read_loss())

    (tmp_path / "flaxmodels.py").write_text(FLAX_MLP)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = Config(workload="flaxmodels:mlp", framework="jax", batch_size=32, optimizer="adam", lr=1e-2,
                    input_shape=(64,), num_classes=10)
    native = backend.native(config)
    assert native.facts["params"] == 64 * 64 + 64 + 64 * 10 + 10
    trainer = backend.build(native, config, native.make_batches(32, 1))
    losses = []
    for _ in range(10):
        trainer.step()
        losses.append(trainer.read_loss())
    assert losses[-1] < 0.8 * losses[0], losses


def test_a_factory_that_returns_no_flax_module_is_one_line(monkeypatch):
    pytest.importorskip("flax")
    from gpubench.workloads.source import SourceError
    from tests.conftest import REPO

    monkeypatch.syspath_prepend(str(REPO / "examples" / "own-model"))
    config = Config(workload="mymodels:small_convnet", framework="jax", input_shape=(3, 16, 16), num_classes=10)
    with pytest.raises(SourceError, match="the factory returned SmallConvNet, not a flax.linen.Module"):
        get_backend("jax").native(config)
    no_shape = Config(workload="mymodels:flax_convnet", framework="jax")
    with pytest.raises(SourceError, match="a Flax module declares no input; give input_shape"):
        get_backend("jax").native(no_shape)


def test_the_attention_setting_in_jax():
    """sdpa (jax.nn.dot_product_attention) and math (the two products) give the same logits;
    cuDNN's kernel is refused on a CPU, FlashAttention (PyTorch's) with the note naming JAX's."""
    from gpubench.backends.jax.model import forward as jax_forward

    spec = spec_of("gpt", {"layers": 1, "d_model": 32, "heads": 2, "seq_len": 16, "vocab": 64})
    params, state = to_params(spec.init_weights(0)), init_state(spec)
    x = jax.numpy.asarray(np.random.default_rng(0).integers(0, 64, (2, 16)), jax.numpy.int32)
    sdpa = jax_forward(spec, params, state, x, train=False)[0]
    math = jax_forward(spec, params, state, x, train=False, attention="math")[0]
    np.testing.assert_allclose(np.asarray(sdpa), np.asarray(math), rtol=1e-5, atol=1e-5)
    workload_params = (("d_model", 32), ("heads", 2), ("layers", 1), ("seq_len", 16), ("vocab", 64))
    backend = get_backend("jax")
    assert backend.unsupported(Config(workload="gpt", workload_params=workload_params, attention="cudnn")) == (
        "attention = cudnn is cuDNN's kernel, on CUDA; on CPU JAX offers sdpa and math")
    flash = backend.unsupported(Config(workload="gpt", workload_params=workload_params, attention="flash"))
    assert flash.startswith("jax does not support attention = flash; it supports: math, sdpa, cudnn (JAX has no")


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_a_checkpointed_language_model_computes_what_the_plain_one_does(framework):
    """gpt with activation checkpointing (each block recomputed, the output head tied to the
    embedding outside the recomputed blocks): the same losses as without."""
    from gpubench.workloads.data import task_batches

    params = {"layers": 2, "d_model": 32, "heads": 2, "seq_len": 16, "vocab": 64}
    spec = spec_of("gpt", params)
    batches = task_batches(spec, 4, 2, seed=0)

    def config(**settings):
        return Config(workload="gpt", batch_size=4, optimizer="sgd", lr=0.05,
                      workload_params=tuple(sorted(params.items())), **settings)

    reference = losses(framework, spec, config(), batches, 3)
    np.testing.assert_allclose(losses(framework, spec, config(checkpointing="activations"), batches, 3), reference,
                               rtol=1e-5)
    assert reference[-1] < reference[0]
