"""The JAX backend: device and precision rules, probing, building trainers."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gpubench.backends.base import Backend, DeviceInfo, ProbeInfo, tensor_split_unsupported
from gpubench.backends.pytorch.modes import TORCH_COMPILE_MODES
from gpubench.options import (
    ATTENTION_WORKLOADS,
    DATASETS,
    PRECISIONS,
    USER_FUNCTION,
    Capabilities,
    device_index,
    device_kind,
    parallel_form,
)

if TYPE_CHECKING:
    from pathlib import Path

    from gpubench.backends.base import NativeModel, Trainer
    from gpubench.config import Config
    from gpubench.workloads.base import WorkloadSpec
    from gpubench.workloads.data import Batches

_OOM_TEXT = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


def import_jax() -> ModuleType:
    """JAX, with its GPU allocator set to grow as needed (``XLA_PYTHON_CLIENT_PREALLOCATE =
    false``, read when JAX starts its GPU client, so before any device is touched), as
    TensorFlow's memory growth is turned on: by default JAX takes 75% of every visible GPU when
    it starts, which would starve the other side of a lockstep A/B or any process sharing the
    GPU, and make its peak memory meaningless. A value the user set is kept. Every method of
    the backend that may touch a device imports JAX through this."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    return jax


def host_devices(config: Config) -> None:
    """``dp:N``, ``fsdp:N`` and ``tp:N`` on a CPU: N host devices, which must be asked for before JAX starts its CPU
    backend (the first thing a worker does with JAX). A second trainer in one process (a
    test's) finds the backend started: it then has the devices it was started with. JAX is
    imported here in every case."""
    jax = import_jax()
    kind, n = config.parallel.kind, config.parallel.n
    if kind not in MESH_KINDS or device_kind(config.device) != "cpu":
        return
    try:
        if getattr(jax.config, "jax_num_cpu_devices", 1) < n:
            jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # the backend has started
        pass


MESH_KINDS = ("dp", "fsdp", "tp")  # one process over a mesh of N devices


class JaxBackend(Backend):
    name = "jax"
    install_hint = ("pip install 'gpubench[jax]' (the CPU jax, with Optax and Flax), or pip install 'jax[cuda12]' "
                    "optax flax (GPU)")
    display_name = "JAX"
    calibration_module = "gpubench.backends.jax.calibration"

    @classmethod
    def package_build(cls) -> dict[str, Any] | None:
        """JAX's and jaxlib's versions from their package metadata, without importing them; None
        when JAX is not installed."""
        if importlib.util.find_spec("jax") is None:
            return None
        return {dist: _version(dist) for dist in ("jax", "jaxlib")}

    @classmethod
    def calibration_key(cls) -> dict[str, Any]:
        """JAX's and jaxlib's versions; absent (not None) without JAX, so that the keys of caches
        from before the JAX backend stay valid."""
        return cls.package_build() or {}
    uncompiled = "already one XLA program (jax.jit)"
    # imported, JAX starts no thread and no backend (its CPU or GPU client starts with the first
    # array, in the forked worker)
    fork_preload = ("jax", "jax.numpy", "optax", "gpubench.backends.jax.model")
    colours = {"fp32": "#2ca02c", "tf32": "#98df8a", "amp-fp16": "#00441b", "amp-bf16": "#bcbd22"}  # noqa: RUF012

    capabilities = Capabilities(
        precisions={"cpu": ("fp32", "amp-bf16"), "cuda": PRECISIONS},
        parallelism=("single", "grad-accum", "dp", "fsdp", "tp"),
        compile=("none",),
        best_compile={"cpu": ("none",), "cuda": ("none",)},  # none is jax.jit, XLA-compiled: JAX's only mode
        data=("device", "pipeline"),
        checkpointing=("none", "activations"),
        dataset=(*DATASETS, USER_FUNCTION),
        others={"attention": ("math", "sdpa", "cudnn"), "optimizer_impl": ("auto",)},
        notes={
            "precision=tf32": "tf32 is a CUDA (Ampere or newer) math mode; on CPU use fp32 or amp-bf16",
            "precision=amp-fp16": "float16 with loss scaling is for GPUs; on CPU use amp-bf16",
            "attention=flash": "JAX has no FlashAttention kernel of its own: its fused kernel is cuDNN's "
                               "(attention = cudnn), and sdpa lets jax.nn.dot_product_attention choose",
            "attention=efficient": "efficient is PyTorch's memory-efficient kernel; JAX's fused kernel is cuDNN's "
                                   "(attention = cudnn)",
            **{f"compile={c}": f"JAX always compiles its whole training step with XLA (jax.jit): that is "
                               f"compile = none here, and {c} does not apply"
               for c in ("xla", *TORCH_COMPILE_MODES, "cuda-graph")},
            "memory_format=channels-last": "JAX's convolutions take gpubench's NCHW layout and XLA picks each op's "
                                           "physical layout for the device",
            **{f"parallelism={k}": f"{k}:N is {engine}; JAX's data parallelism in gpubench is dp:N (one process, "
                                   "jax.jit over a mesh of N devices)"
               for k, engine in (("ddp", "PyTorch's DistributedDataParallel"),
                                 ("mirrored", "TensorFlow's MirroredStrategy"),
                                 ("multiworker", "TensorFlow's MultiWorkerMirroredStrategy"),
                                 ("pipeline", "PyTorch's pipeline parallelism"))},
            "parallelism=fsdp+tp": f"{parallel_form('fsdp+tp')} (FSDP over tensor-parallel groups, a 2-D mesh) is "
                                   "PyTorch's in gpubench; JAX runs fsdp:N and tp:N, each over a mesh of N devices",
        })

    def static_unsupported(self, config: Config) -> str | None:
        if config.uses("attention") and config.attention == "cudnn":
            if device_kind(config.device) != "cuda":
                return "attention = cudnn is cuDNN's kernel, on CUDA; on CPU JAX offers sdpa and math"
            if config.precision not in ("amp-fp16", "amp-bf16"):
                return (f"attention = cudnn runs float16 or bfloat16; use precision amp-bf16 or amp-fp16 (at "
                        f"{config.precision}: sdpa or math)")
        if ":" in config.workload and config.precision.startswith("amp"):
            return (f"precision = {config.precision}: a Flax module computes in its own dtype (its dtype attribute); "
                    "gpubench casts only its built-in workloads. Use fp32 or tf32, and set the module's dtype to "
                    "measure a lower precision")
        if ":" in config.workload and config.checkpointing == "activations":
            return ("checkpointing = activations cuts a built-in workload at its layers; wrap your Flax module's "
                    "blocks in nn.remat instead")
        if (kind := config.parallel.kind) in MESH_KINDS and ":" in config.device:
            return f"{kind}:N uses the first N devices of its kind; use device = cuda or cpu, not {config.device}"
        if kind == "tp" and ":" in config.workload:
            return ("tp:N splits the projections of gpubench's transformer blocks; a Flax module's layers are its own "
                    "(shard it with fsdp:N, or give its parameters NamedShardings yourself)")
        if kind == "tp" and config.workload not in ATTENTION_WORKLOADS:
            return (f"tp:N splits a transformer's attention and MLP projections; {config.workload} has none (the "
                    f"built-in transformers: {', '.join(sorted(ATTENTION_WORKLOADS))}; use fsdp:N or dp:N)")
        if kind == "tp":
            return tensor_split_unsupported(config, config.devices)
        return None

    def probe(self) -> ProbeInfo:
        jax = import_jax()
        import jaxlib

        from gpubench.env import cpu_model

        devices = [DeviceInfo("cpu", cpu_model())]
        try:
            gpus = jax.devices("gpu")
        except RuntimeError:
            gpus = []
        for i, gpu in enumerate(gpus):  # (the card's memory is NVML's to say: JAX knows its allocator's limit)
            devices.append(DeviceInfo(f"cuda:{i}", gpu.device_kind))
        build = {"jaxlib": jaxlib.__version__, "default_backend": jax.default_backend(),
                 "optax": _version("optax"), "flax": _version("flax")}
        return ProbeInfo("jax", True, version=jax.__version__, devices=tuple(devices), build=build)

    def check(self, config: Config) -> tuple[str, str] | None:
        reason = self.unsupported(config)
        if reason:
            return ("unsupported", reason)
        if config.threads:  # before anything starts JAX's runtime (looking for GPUs does)
            refused = self.set_threads(config.threads)
            if refused:
                return ("unsupported", refused)
        jax = import_jax()
        import optax  # noqa: F401 - the optimizers: part of what this backend needs installed

        kind, n = config.parallel.kind, config.parallel.n
        if device_kind(config.device) != "cuda":
            return None
        try:
            gpus = jax.devices("gpu")
        except RuntimeError:
            return ("unavailable", f"no GPU visible to JAX {jax.__version__} (jaxlib without CUDA, or no driver)")
        if kind in MESH_KINDS and len(gpus) < n:
            return ("unavailable", f"{config.parallelism} needs {n} GPUs; JAX sees {len(gpus)}")
        index = device_index(config.device)
        if index >= len(gpus):
            return ("unavailable", f"{config.device} requested; JAX sees {len(gpus)} GPU(s)")
        cc = getattr(gpus[index], "compute_capability", None)
        if config.precision in ("tf32", "amp-bf16") and cc and float(cc) < 8.0:
            return ("unsupported", f"{config.precision} needs compute capability 8.0 or newer; this GPU is {cc}")
        return None

    def set_threads(self, n: int) -> str | None:
        """JAX sizes its CPU thread pools from the CPUs the process may run on: ``threads = n``
        pins this process to n of them, before JAX starts (the threads it starts later, Python's
        included, inherit the pinning)."""
        if getattr(self, "_pinned", None) == n:  # done by check(), before it looked for GPUs
            return None
        if "jax" in sys.modules and _started():
            return "JAX's runtime had started before its thread pools could be sized"
        allowed = sorted(os.sched_getaffinity(0))
        if n > len(allowed):
            return f"threads = {n}, but this process may run on {len(allowed)} CPUs"
        os.sched_setaffinity(0, allowed[:n])
        self._pinned = n
        return None

    def native(self, config: Config, counts: Path | None = None, count: bool = True) -> NativeModel:
        host_devices(config)
        from gpubench.backends.jax.native import native_model

        return native_model(config, counts, count)

    def build(self, model: NativeModel | WorkloadSpec, config: Config, batches: Batches) -> Trainer:
        host_devices(config)
        from gpubench.backends.jax.trainer import JaxTrainer

        return JaxTrainer(model, config, batches)

    def is_oom(self, exc: BaseException) -> bool:
        if isinstance(exc, MemoryError):
            return True
        return type(exc).__name__ in ("XlaRuntimeError", "JaxRuntimeError") and any(t in str(exc) for t in _OOM_TEXT)


def _started() -> bool:
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge._backends)
    except (ImportError, AttributeError):
        return False


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None
