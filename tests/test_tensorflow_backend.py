"""The TensorFlow backend on CPU, and its GPU device/precision logic with faked GPUs."""

from __future__ import annotations

import math
import time

import pytest

tf = pytest.importorskip("tensorflow")

from gpubench.backends import get_backend  # noqa: E402
from gpubench.backends.tensorflow.trainer import WindowTimer  # noqa: E402
from gpubench.measure.loop import run_loop  # noqa: E402
from gpubench.suite import Config  # noqa: E402
from gpubench.workloads import get_workload  # noqa: E402
from gpubench.workloads.data import synthetic_batches  # noqa: E402


def trainer(workload="mlp", **kw):
    params = {"depth": 2, "width": 64} if workload == "mlp" else {}
    config = Config(workload=workload, batch_size=32, workload_params=tuple(sorted(params.items())), **kw)
    spec = get_workload(workload).spec(**params)
    return get_backend("tensorflow").build(spec, config, synthetic_batches(spec, 32, 16, seed=0))


@pytest.mark.parametrize("workload, kw", [
    ("mlp", {}),
    ("mlp", {"precision": "amp-bf16"}),
    ("mlp", {"compile": "xla"}),
    ("mlp", {"data": "pipeline"}),
    ("cnn", {}),
])
def test_training_runs_and_loss_falls(workload, kw):
    t = trainer(workload, **kw)
    raw = run_loop(t, warmup_steps=2, steps=10, windows=3)
    assert not raw.diverged and all(math.isfinite(v) for v in raw.losses)
    assert raw.loss_last < 0.7 * raw.loss_first
    assert len(raw.step_times_ms) == 30 and all(s > 0 for s in raw.step_times_ms)
    info = t.describe()
    assert info["step_timing"] == "host_clock"
    assert info["xla"] == (kw.get("compile") == "xla")
    assert info["mixed_precision_policy"] == ("mixed_bfloat16" if kw.get("precision") == "amp-bf16" else None)
    assert info["data"] == ("tf.data(prefetch)" if kw.get("data") == "pipeline" else "device-resident")


def test_pipeline_and_device_modes_see_the_same_batches_in_the_same_order():
    a = trainer("mlp", optimizer="sgd", lr=0.01)
    b = trainer("mlp", optimizer="sgd", lr=0.01, data="pipeline")
    la, lb = [], []
    for _ in range(20):  # more steps than the 16 batches: the pipeline wraps around like the pool
        a.step()
        b.step()
        la.append(a.read_loss())
        lb.append(b.read_loss())
    assert la == pytest.approx(lb, rel=1e-5)


def test_static_rules():
    backend = get_backend("tensorflow")
    assert "tf32" in backend.unsupported(Config(workload="cnn", precision="tf32"))
    assert "amp-bf16" in backend.unsupported(Config(workload="cnn", precision="amp-fp16"))
    assert backend.unsupported(Config(workload="cnn", precision="amp-bf16", compile="xla")) is None
    assert backend.check(Config(workload="cnn")) is None


class FakeGPU:
    def __init__(self, name):
        self.name = name


@pytest.fixture
def fake_gpus(monkeypatch):
    """Pretend TensorFlow sees GPUs with the given compute capabilities."""
    def install(*capabilities):
        gpus = [FakeGPU(f"/physical_device:GPU:{i}") for i in range(len(capabilities))]
        details = {g.name: {"device_name": f"Fake GPU {i}", "compute_capability": cc}
                   for i, (g, cc) in enumerate(zip(gpus, capabilities))}
        monkeypatch.setattr(tf.config, "list_physical_devices",
                            lambda kind=None: list(gpus) if kind == "GPU" else [])
        monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda g: details[g.name])
        monkeypatch.setattr(tf.config.experimental, "set_memory_growth", lambda g, on: None)
    return install


def test_gpu_selection_logic_with_faked_gpus(fake_gpus):
    backend = get_backend("tensorflow")
    fake_gpus((9, 0), (7, 5))
    assert backend.check(Config(workload="cnn", device="cuda")) is None
    assert backend.check(Config(workload="cnn", device="cuda:0", precision="tf32")) is None
    assert backend.check(Config(workload="cnn", device="cuda:0", precision="amp-fp16")) is None
    status, reason = backend.check(Config(workload="cnn", device="cuda:1", precision="amp-bf16"))
    assert status == "unsupported" and "compute capability 8.0" in reason and "7.5" in reason
    assert backend.check(Config(workload="cnn", device="cuda:1", precision="tf32"))[0] == "unsupported"
    assert backend.check(Config(workload="cnn", device="cuda:1", precision="amp-fp16")) is None
    status, reason = backend.check(Config(workload="cnn", device="cuda:2"))
    assert status == "unavailable" and "TensorFlow sees 2 GPU(s)" in reason
    probe = backend.probe()
    assert probe.device_names() == ["cpu", "cuda:0", "cuda:1"]
    assert probe.devices[1].model == "Fake GPU 0"


def test_no_gpu_is_unavailable(fake_gpus):
    fake_gpus()
    status, reason = get_backend("tensorflow").check(Config(workload="cnn", device="cuda"))
    assert status == "unavailable" and "no GPU visible to TensorFlow" in reason


def test_window_timer_gives_the_window_mean():
    timer = WindowTimer(4)
    timer.mark()
    for _ in range(4):
        time.sleep(0.01)
        timer.mark()
    (mean,) = timer.elapsed_ms()
    assert 10.0 <= mean < 50.0
    assert WindowTimer(3).elapsed_ms() == []


def test_oom_classification_and_probe():
    backend = get_backend("tensorflow")
    assert backend.is_oom(tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor"))
    assert backend.is_oom(MemoryError())
    assert not backend.is_oom(ValueError("shapes"))
    probe = backend.probe()
    assert probe.available and probe.version == tf.__version__
    assert "keras" in probe.build and "cuda_build" in probe.build


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "tf32", "amp-fp16", "amp-bf16"])
def test_gpu_training(precision):
    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("TensorFlow sees no GPU")
    t = trainer("cnn", device="cuda", precision=precision)
    raw = run_loop(t, warmup_steps=2, steps=10, windows=2)
    assert raw.loss_last < raw.loss_first and t.memory()["peak_allocated_bytes"] > 0


def test_tensorflow_computes_attention_as_its_matrix_products():
    """TensorFlow has no fused attention kernel: sdpa and math are both its graph of matrix
    products; a fused kernel is unsupported with that reason."""
    params = (("d_model", 32), ("heads", 2), ("layers", 1), ("seq_len", 16), ("vocab", 64))
    backend = get_backend("tensorflow")
    for attention in ("math", "sdpa"):
        assert backend.unsupported(Config(workload="gpt", framework="tensorflow", workload_params=params,
                                          attention=attention)) is None
    for attention in ("flash", "efficient", "cudnn"):
        reason = backend.unsupported(Config(workload="gpt", framework="tensorflow", workload_params=params,
                                            attention=attention))
        assert reason == (f"tensorflow does not support attention = {attention}; it supports: math, sdpa (TensorFlow "
                          "has no fused attention kernel: its attention (sdpa, math) is its matrix products and a "
                          "softmax (XLA may fuse them: compile = xla))")
