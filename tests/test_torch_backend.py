"""The PyTorch backend on CPU: model translation, FLOPs cross-check, training, statuses."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gpubench.backends import get_backend  # noqa: E402
from gpubench.backends.pytorch.model import build_model  # noqa: E402
from gpubench.measure.loop import run_loop  # noqa: E402
from gpubench.suite import Config  # noqa: E402
from gpubench.workloads import get_workload  # noqa: E402
from gpubench.workloads.data import synthetic_batches  # noqa: E402


@pytest.mark.parametrize("name, params", [("cnn", {}), ("mlp", {"depth": 3, "width": 64})])
def test_torch_model_matches_the_spec(name, params):
    spec = get_workload(name).spec(**params)
    model = build_model(spec, spec.init_weights(0))
    assert sum(p.numel() for p in model.parameters()) == spec.params
    loaded = [p.detach().numpy() for p in model.parameters()]
    canonical = [w for layer in spec.init_weights(0) for w in layer]
    assert all(np.array_equal(a, b) for a, b in zip(loaded, canonical))


@pytest.mark.parametrize("name, params", [("cnn", {}), ("mlp", {"depth": 4, "width": 32})])
def test_analytic_flops_match_torch_flop_counter(name, params):
    from torch.utils.flop_counter import FlopCounterMode

    spec = get_workload(name).spec(**params)
    model = build_model(spec)
    x = torch.randn(3, *spec.input_shape)
    y = torch.randint(0, spec.num_classes, (3,))
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    assert counter.get_total_flops() == 3 * spec.train_flops_per_sample


@pytest.mark.parametrize("causal", [False, True])
def test_a_transformers_flops_are_the_formula_and_torchs_count(causal):
    """ViT's FLOPs from the spec: per block 2T(3d^2 + d^2 + 2rd^2) + 4T^2 d (attention over the
    whole square, causal or not, as nanoGPT and PaLM count), plus the patch projection and the
    head; FlopCounterMode counts the same, forward and training step, with attention run by the
    math kernel (it registers no FLOPs for the fused CPU kernel, so it would count none)."""
    from dataclasses import replace

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from gpubench.workloads.base import TransformerBlock

    spec = get_workload("vit").spec(layers=2, d_model=64, heads=4)
    if causal:  # the same model with a causal mask: the same count
        spec = replace(spec, layers=tuple(replace(x, causal=True) if isinstance(x, TransformerBlock) else x
                                          for x in spec.layers))
    t, d, r, patches = 65, 64, 4, 64
    block = 2 * t * (3 * d * d + d * d + 2 * r * d * d) + 4 * t * t * d
    assert spec.forward_flops_per_sample == 2 * 3 * 16 * d * patches + 2 * block + 2 * d * 10
    assert spec.train_flops_per_sample == 2 * (2 * 3 * 16 * d * patches) + 3 * (2 * block + 2 * d * 10)
    model = build_model(spec, spec.init_weights(0))
    x = torch.randn(3, *spec.input_shape)
    y = torch.randint(0, spec.num_classes, (3,))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as forward:
        model(x)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as step:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    assert forward.get_total_flops() == 3 * spec.forward_flops_per_sample
    assert step.get_total_flops() == 3 * spec.train_flops_per_sample


def test_a_language_models_flops_are_the_formula_and_torchs_count():
    """GPT: the causal blocks as ViT's, the tied head 2 T d V (its weight gradient and its input
    gradient in training), the token embedding a lookup (no FLOPs); GPT-2 small's count per
    token is within 0.1% of nanoGPT's 6N + 12 L T d (N: the parameters but the positions; the
    spec leaves out the layer norms' and biases' share of 6N)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from gpubench.workloads.data import task_batches

    spec = get_workload("gpt").spec(layers=2, d_model=64, heads=4, seq_len=32, vocab=100)
    t, d, r, v = 32, 64, 4, 100
    block = 2 * t * (3 * d * d + d * d + 2 * r * d * d) + 4 * t * t * d
    assert spec.forward_flops_per_sample == 2 * block + 2 * t * d * v
    assert spec.train_flops_per_sample == 3 * spec.forward_flops_per_sample
    model = build_model(spec, spec.init_weights(0))
    assert sum(p.numel() for p in model.parameters()) == spec.params == v * d + t * d + 2 * (12 * d * d + 13 * d) + 2 * d
    batch = task_batches(spec, 3, 1, seed=0)
    x, y = torch.from_numpy(batch.x[0]), torch.from_numpy(batch.y[0])
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as step:
        torch.nn.functional.cross_entropy(model(x).reshape(-1, v), y.reshape(-1)).backward()
    assert step.get_total_flops() == 3 * spec.train_flops_per_sample
    small = get_workload("gpt").spec(layers=12, d_model=768, heads=12, seq_len=1024, vocab=50257)
    assert small.params == 124_439_808  # GPT-2 small, tied
    nanogpt = 6 * (small.params - 1024 * 768) + 12 * 12 * 1024 * 768
    assert 0.999 * nanogpt < small.train_flops_per_sample / 1024 < nanogpt


def _trainer(workload: str, precision: str = "fp32", **params):
    config = Config(workload=workload, batch_size=32, precision=precision, lr=1e-3,
                    workload_params=tuple(sorted(params.items())))
    spec = get_workload(workload).spec(**params)
    return get_backend("torch").build(spec, config, synthetic_batches(spec, 32, 16, seed=0))


@pytest.mark.parametrize("workload, precision, params", [
    ("mlp", "fp32", {"depth": 2, "width": 64}),
    ("mlp", "amp-bf16", {"depth": 2, "width": 64}),
    ("cnn", "fp32", {}),
])
def test_loss_falls_on_the_synthetic_task(workload, precision, params):
    raw = run_loop(_trainer(workload, precision, **params), warmup_steps=2, steps=10, windows=3)
    assert not raw.diverged
    assert all(math.isfinite(v) for v in raw.losses)
    assert raw.loss_last < 0.7 * raw.loss_first
    assert len(raw.step_times_ms) == 30 and all(t > 0 for t in raw.step_times_ms)


def test_same_seed_same_losses():
    a = run_loop(_trainer("mlp", depth=1, width=16), 0, 3, 1).losses
    b = run_loop(_trainer("mlp", depth=1, width=16), 0, 3, 1).losses
    assert a == b


def test_static_rules_and_checks_on_cpu():
    backend = get_backend("torch")
    assert "tf32" in backend.unsupported(Config(workload="cnn", precision="tf32"))
    assert "amp-bf16" in backend.unsupported(Config(workload="cnn", precision="amp-fp16"))
    assert backend.unsupported(Config(workload="cnn", precision="amp-bf16")) is None
    assert backend.check(Config(workload="cnn", device="cpu")) is None
    assert backend.check(Config(workload="cnn", device="cpu", precision="tf32"))[0] == "unsupported"
    if not torch.cuda.is_available():
        status, reason = backend.check(Config(workload="cnn", device="cuda"))
        assert status == "unavailable" and "no CUDA device" in reason


def test_oom_classification():
    backend = get_backend("torch")
    assert backend.is_oom(MemoryError())
    assert backend.is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"))
    assert backend.is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert backend.is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert backend.is_oom(RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"))
    assert not backend.is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert backend.is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"))
    assert not backend.is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED"))
    assert not backend.is_oom(RuntimeError("CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasSgemm( handle, ...)`"))


def test_probe_lists_cpu():
    info = get_backend("torch").probe()
    assert info.available and info.version == torch.__version__
    assert info.device_names()[0] == "cpu"
    assert info.build["num_threads"] >= 1


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "tf32", "amp-fp16", "amp-bf16"])
def test_cuda_training_runs_and_loss_falls(precision):
    config = Config(workload="cnn", device="cuda", batch_size=64, precision=precision)
    spec = get_workload("cnn").spec()
    trainer = get_backend("torch").build(spec, config, synthetic_batches(spec, 64, 4, seed=0))
    raw = run_loop(trainer, warmup_steps=2, steps=10, windows=2)
    assert raw.loss_last < raw.loss_first
    assert trainer.memory()["peak_allocated_bytes"] > 0


@pytest.mark.parametrize("device, expected", [("cuda", "cuda:0"), ("cuda:1", "cuda:1")])
def test_a_cuda_device_always_gets_an_index(monkeypatch, device, expected):
    # torch.cuda.set_device refuses a bare "cuda" (every GPU suite's device); no GPU needed:
    # the check is torch's own, run on what the trainer hands it
    import torch
    from torch.cuda._utils import _get_device_index

    from gpubench.backends.pytorch.trainer import TorchTrainer

    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: chosen.append(_get_device_index(d)))
    trainer = TorchTrainer.__new__(TorchTrainer)  # only its device setup
    trainer._setup(Config(workload="mlp", device=device))
    assert str(trainer.device) == expected and chosen == [int(expected[-1])]


def test_make_optimizer_takes_every_setting_of_the_config():
    from gpubench.backends.pytorch.trainer import make_optimizer
    from gpubench.config import Config

    p = [torch.nn.Parameter(torch.zeros(2))]
    config = Config(workload="mlp", optimizer="adamw", beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.1)
    group = make_optimizer("adamw", p, 1e-3, fused=False, settings=config.optimizer_settings()).param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.8, 0.95), 1e-6, 0.1)
    group = make_optimizer("sgd", p, 1e-2, fused=False, settings=Config(workload="mlp", optimizer="sgd",
                                                                         momentum=0.0).optimizer_settings()).param_groups[0]
    assert group["momentum"] == 0.0
    group = make_optimizer("adam", p, 1e-3, fused=False).param_groups[0]  # no settings: the defaults
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.9, 0.999), 1e-8, 0)


def _tiny_gpt_run(tmp_path, rest: str):
    """gpubench run of a one-block gpt, 4 sequences of 16 tokens, with ``rest`` (TOML lines: more
    defaults, then a [matrix]); the finished process and its run directory."""
    from tests.conftest import run_cli

    suite = tmp_path / "t.toml"
    suite.write_text('name = "t"\n[defaults]\nworkload = "gpt"\nlayers = 1\nd_model = 32\nheads = 2\nseq_len = 16\n'
                     'vocab = 64\nbatch_size = 4\nwarmup_steps = 1\nwindows = 2\n' + rest)
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--no-report", "--no-calibrate"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    return proc, run_dir


def test_a_language_model_runs_through_the_cli_with_tokens_per_second(tmp_path):
    """gpt through gpubench run: the result's model block says its tokens a sample, tokens/s is
    throughput x sequence length, the loss falls; a pipeline:N config is refused (the tied head)."""
    from gpubench.results.metrics import BY_NAME
    from gpubench.results.store import load_results

    proc, run_dir = _tiny_gpt_run(tmp_path, 'steps = 3\nlr = 0.01\n[matrix]\nparallelism = ["single", "pipeline:2"]\n')
    ok, refused = sorted(load_results(run_dir), key=lambda r: r.config["parallelism"], reverse=True)
    assert ok.status == "ok" and ok.get("model", "tokens_per_sample") == 16
    assert BY_NAME["tokens_per_s"].value(ok) == pytest.approx(16 * ok.get("metrics", "throughput", "median"))
    assert ok.get("metrics", "loss", "last") < ok.get("metrics", "loss", "first")
    assert refused.status == "unsupported" and "tied to its token embedding" in refused.reason
    assert "tokens/s" in proc.stdout


@pytest.mark.slow
def test_the_attention_setting_picks_the_kernel_and_says_what_cannot_run(tmp_path):
    """attention = math / flash / sdpa give the same logits here (the CPU has the math and the
    FlashAttention kernels); a kernel a device lacks, or a precision it cannot run, is refused
    before anything starts; a model without attention neither uses nor names the setting."""
    from gpubench.results.store import load_results

    spec = get_workload("gpt").spec(layers=1, d_model=32, heads=2, seq_len=16, vocab=64)
    weights = spec.init_weights(0)
    x = torch.randint(0, 64, (2, 16))
    sdpa = build_model(spec, weights)(x)
    for attention in ("math", "flash"):
        torch.testing.assert_close(build_model(spec, weights, attention)(x), sdpa, rtol=1e-5, atol=1e-5)
    params = (("d_model", 32), ("heads", 2), ("layers", 1), ("seq_len", 16), ("vocab", 64))
    backend = get_backend("torch")

    def refused(**settings):
        return backend.unsupported(Config(workload="gpt", workload_params=params, **settings))

    assert refused(attention="cudnn") == ("attention = cudnn is a CUDA kernel; on CPU PyTorch offers sdpa, math and "
                                          "flash (its CPU FlashAttention)")
    assert refused(attention="flash", device="cuda").startswith("attention = flash runs float16 or bfloat16 on CUDA")
    assert refused(attention="flash", device="cuda", precision="amp-bf16") is None
    cnn = Config(workload="cnn", attention="math").normalised()
    assert cnn.attention == "sdpa" and "attention" not in cnn.config_id and backend.unsupported(cnn) is None
    assert Config(workload="gpt", workload_params=params, attention="math").config_id.endswith("-attention=math")

    _, run_dir = _tiny_gpt_run(tmp_path, 'steps = 2\n[matrix]\nattention = ["math", "flash", "efficient"]\n')
    got = {r.config["attention"]: (r.status, r.reason) for r in load_results(run_dir)}
    assert got["math"][0] == got["flash"][0] == "ok"
    assert got["efficient"] == ("unsupported", "attention = efficient is a CUDA kernel; on CPU PyTorch offers sdpa, "
                                               "math and flash (its CPU FlashAttention)")


def test_the_tied_head_is_the_embeddings_parameter_and_amp_keeps_the_stream_in_bf16():
    """The head's weight is the token embedding's own parameter (registered in both modules, so
    DataParallel's replicas and DDP see the tie; counted and loaded once); under autocast the
    embedding's output is in the compute dtype, as JAX's and Keras' are."""
    from gpubench.options import ATTENTION_WORKLOADS
    from gpubench.workloads import WORKLOADS

    assert ATTENTION_WORKLOADS == {w.name for w in WORKLOADS.values() if w.attention} == {"gpt", "vit"}
    spec = get_workload("gpt").spec(layers=1, d_model=32, heads=2, seq_len=16, vocab=64)
    model = build_model(spec, spec.init_weights(0))
    assert model[-1].weight is model[0].weight
    assert sum(p.numel() for p in model.parameters()) == spec.params
    np.testing.assert_array_equal(model[-1].weight.detach().numpy(), spec.init_weights(0)[0][0])
    x = torch.randint(0, 64, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model[0](x).dtype == torch.bfloat16
    assert model[0](x).dtype == torch.float32


@pytest.mark.parametrize("impl,flags", [("fused", {"fused": True}), ("foreach", {"foreach": True}),
                                        ("for-loop", {"foreach": False}), ("auto", {"fused": None})])
def test_optimizer_impl_asks_pytorch_for_that_implementation(impl, flags):
    import torch

    from gpubench.backends.pytorch.trainer import make_optimizer

    for name in ("adam", "adamw", "sgd"):
        opt = make_optimizer(name, [torch.nn.Parameter(torch.zeros(3))], 0.1, fused=False, impl=impl)
        assert {k: opt.defaults.get(k) for k in flags} == flags, name


def test_fused_and_for_loop_updates_train_alike_on_the_cpu():
    """The same config under two optimizer implementations: the same losses (to rounding)."""
    from gpubench.backends import get_backend
    from gpubench.config import Config

    losses = {}
    for impl in ("for-loop", "fused"):
        config = Config(framework="torch", workload="mlp", device="cpu", batch_size=16, optimizer="adamw",
                        optimizer_impl=impl)
        backend = get_backend("torch")
        native = backend.native(config)
        trainer = backend.build(native, config, native.make_batches(config.batch, 1))
        out = []
        for _ in range(4):
            trainer.step()
            out.append(trainer.read_loss())
        losses[impl] = out
    assert losses["fused"] == pytest.approx(losses["for-loop"], rel=1e-4)
    assert losses["fused"][-1] < losses["fused"][0]
