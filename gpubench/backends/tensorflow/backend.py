"""The TensorFlow backend: device and precision rules, probing, building trainers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpubench.backends.base import Backend, DeviceInfo, ProbeInfo
from gpubench.backends.pytorch.modes import TORCH_COMPILE_MODES
from gpubench.backends.tensorflow.runtime import PORT_BASE_ENV, SLURM_CLUSTER_ENV, import_tf
from gpubench.options import (
    PRECISIONS,
    Capabilities,
    RankStart,
    device_index,
    device_kind,
    parallel_form,
)

if TYPE_CHECKING:
    from gpubench.backends.base import NativeModel, Trainer
    from gpubench.config import Config
    from gpubench.workloads.base import WorkloadSpec
    from gpubench.workloads.data import Batches

_OOM_TEXT = ("OOM when allocating", "out of memory", "can't allocate memory")


class TensorFlowBackend(Backend):
    name = "tensorflow"
    install_hint = "pip install tensorflow-cpu==2.21.0 (CPU) or pip install 'tensorflow[and-cuda]' (GPU)"
    display_name = "TensorFlow"
    calibration_module = "gpubench.backends.tensorflow.calibration"
    zoos = ("keras",)

    @classmethod
    def package_build(cls) -> dict[str, Any] | None:
        """TensorFlow's version and distribution name (``tensorflow``, ``tensorflow-cpu``, ...: a CUDA
        build or not) from the metadata of the package that installed it, without importing it;
        None when it is not installed, ``None`` fields when no metadata names it."""
        spec = importlib.util.find_spec("tensorflow")
        if spec is None or not spec.submodule_search_locations:
            return None
        site = Path(list(spec.submodule_search_locations)[0]).parent
        for info in sorted(site.glob("*.dist-info")):
            try:
                if "tensorflow" not in (info / "top_level.txt").read_text(encoding="utf-8").split():
                    continue
                metadata = (info / "METADATA").read_text(encoding="utf-8").splitlines()
                fields = dict(line.split(": ", 1) for line in metadata if line.startswith(("Name: ", "Version: ")))
            except (OSError, UnicodeDecodeError):
                continue
            return {"version": fields.get("Version"), "dist": fields.get("Name")}
        return {"version": None, "dist": None}

    def share_process(self) -> None:
        """A CUDA build of torch brings Triton, whose import (PyTorch's FLOP counter,
        torch.compile) crashes a process that has loaded TensorFlow's libraries first (SIGSEGV;
        the other order works): load it before TensorFlow."""
        if "tensorflow" not in sys.modules and importlib.util.find_spec("triton") is not None:
            import triton  # noqa: F401

    @classmethod
    def calibration_key(cls) -> dict[str, Any]:
        """The version and distribution (a CUDA build or not); None for both without TensorFlow."""
        build = cls.package_build() or {}
        return {"tensorflow": build.get("version"), "tensorflow_dist": build.get("dist")}
    uncompiled = "already one tf.function graph"
    colours = {"fp32": "#d62728", "tf32": "#ff9896", "amp-fp16": "#7f0000", "amp-bf16": "#ff7f0e"}  # noqa: RUF012

    capabilities = Capabilities(
        precisions={"cpu": ("fp32", "amp-bf16"), "cuda": PRECISIONS},
        parallelism=("single", "grad-accum", "mirrored", "multiworker"),
        compile=("none", "xla"),
        data=("device", "pipeline"),
        # no fused attention kernel: sdpa, TensorFlow's own, is its matrix products, as math is
        others={"attention": ("math", "sdpa"), "optimizer_impl": ("auto",)},
        notes={
            "precision=tf32": "tf32 is a CUDA (Ampere or newer) math mode; on CPU use fp32 or amp-bf16",
            "precision=amp-fp16": "mixed_float16 with loss scaling is for GPUs; on CPU use amp-bf16",
            **{f"attention={a}": "TensorFlow has no fused attention kernel: its attention (sdpa, math) is its "
                                 "matrix products and a softmax (XLA may fuse them: compile = xla)"
               for a in ("flash", "efficient", "cudnn")},
            **{f"compile={c}": f"{c} is a PyTorch setting; TensorFlow's training step is a tf.function (compile = "
                               "none) or an XLA-compiled one (compile = xla)"
               for c in (*TORCH_COMPILE_MODES, "cuda-graph")},
            "memory_format=channels-last": "channels-last is a PyTorch setting; Keras here always runs convolutions "
                                           "channels-last (NHWC)",
            "checkpointing=activations": "activation checkpointing is implemented for PyTorch only: TensorFlow's "
                                         "tf.recompute_grad re-runs Keras Dropout with a new mask (wrong gradients) "
                                         "and BatchNormalization's moving-statistics update when it recomputes",
            **{f"parallelism={k}": f"{k}:N is PyTorch's {engine}; TensorFlow's data parallelism in gpubench is "
                                   "mirrored:N (MirroredStrategy) or multiworker:N (MultiWorkerMirroredStrategy)"
               for k, engine in (("ddp", "DistributedDataParallel"), ("dp", "DataParallel"),
                                 ("pipeline", "pipeline parallelism (torch.distributed.pipelining)"))},
            **{f"parallelism={k}": f"{parallel_form(k)} ({what}) is {where} in gpubench; "
                                   "Keras has no sharded strategy gpubench drives: TensorFlow's data parallelism "
                                   "here is mirrored:N or multiworker:N"
               for k, what, where in (
                   ("fsdp", "parameters, gradients and optimizer state sharded over the ranks", "PyTorch's and JAX's"),
                   ("tp", "a transformer's projections split over the ranks", "PyTorch's and JAX's"),
                   ("fsdp+tp", "tensor parallel within groups of B ranks, sharded across them", "PyTorch's"))},
        },
        # multiworker:N: every worker a process of its own (TensorFlow ships no launcher); under
        # Slurm, TensorFlow's SlurmClusterResolver makes the cluster (trainer._multiworker_strategy)
        rank_start={"multiworker": RankStart(slurm_env=(f"{SLURM_CLUSTER_ENV}=slurm", f"{PORT_BASE_ENV}=$port"))},
        best_compile={"cpu": ("xla",), "cuda": ("xla",)})  # the step XLA-compiled (jit_compile)

    def static_unsupported(self, config: Config) -> str | None:
        parallel = config.parallel.kind
        if parallel == "mirrored" and ":" in config.device:
            return f"mirrored:N uses /GPU:0../GPU:N-1; use device = cuda, not {config.device}"
        if parallel == "multiworker" and ":" in config.device:
            return f"multiworker:N puts worker r on /GPU:r of its node; use device = cuda, not {config.device}"
        return None

    def probe(self) -> ProbeInfo:
        tf = import_tf()
        import keras

        from gpubench.env import cpu_model

        info = tf.sysconfig.get_build_info()
        devices = [DeviceInfo("cpu", cpu_model())]
        for i, gpu in enumerate(tf.config.list_physical_devices("GPU")):
            details = tf.config.experimental.get_device_details(gpu)
            devices.append(DeviceInfo(f"cuda:{i}", details.get("device_name", gpu.name)))
        build = {
            "keras": keras.__version__,
            "cuda_build": bool(info.get("is_cuda_build")),
            "cuda": info.get("cuda_version"),
            "cudnn": info.get("cudnn_version"),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        }
        return ProbeInfo("tensorflow", True, version=tf.__version__, devices=tuple(devices), build=build)

    def check(self, config: Config) -> tuple[str, str] | None:
        reason = self.unsupported(config)
        if reason:
            return ("unsupported", reason)
        tf = import_tf()
        if device_kind(config.device) != "cuda":
            return None
        gpus = tf.config.list_physical_devices("GPU")
        kind, n = config.parallel.kind, config.parallel.n
        if kind in ("mirrored", "multiworker") and gpus and len(gpus) < n:
            return ("unavailable", f"{config.parallelism} needs {n} GPUs; TensorFlow sees {len(gpus)}")
        if not gpus:
            build = "a CUDA build" if tf.test.is_built_with_cuda() else "a CPU-only build"
            return ("unavailable", f"no GPU visible to TensorFlow {tf.__version__} ({build})")
        index = device_index(config.device)
        if index >= len(gpus):
            return ("unavailable", f"{config.device} requested; TensorFlow sees {len(gpus)} GPU(s)")
        cc = tf.config.experimental.get_device_details(gpus[index]).get("compute_capability")
        if config.precision in ("tf32", "amp-bf16") and cc is not None and tuple(cc) < (8, 0):
            return ("unsupported", f"{config.precision} needs compute capability 8.0 or newer; this GPU is "
                                   f"{cc[0]}.{cc[1]}")
        return None

    def set_threads(self, n: int) -> str | None:
        tf = import_tf()
        threading = tf.config.threading
        try:
            threading.set_intra_op_parallelism_threads(n)
            threading.set_inter_op_parallelism_threads(n)
        except RuntimeError:  # the runtime has started: it keeps the pools it made
            if (threading.get_intra_op_parallelism_threads(), threading.get_inter_op_parallelism_threads()) != (n, n):
                return "TensorFlow's runtime had started before its thread pools could be set"
        return None

    def native(self, config: Config, counts: Path | None = None, count: bool = True) -> NativeModel:
        import_tf()
        kind, n = config.parallel.kind, config.parallel.n
        if kind == "mirrored" and device_kind(config.device) == "cpu":  # before the model touches TensorFlow
            from gpubench.backends.tensorflow.trainer import logical_cpus

            logical_cpus(n)
        from gpubench.backends.tensorflow.native import native_model

        return native_model(config, counts, count)

    def build(self, model: NativeModel | WorkloadSpec, config: Config, batches: Batches) -> Trainer:
        from gpubench.backends.tensorflow.trainer import TFTrainer

        return TFTrainer(model, config, batches)

    def is_oom(self, exc: BaseException) -> bool:
        tf = import_tf()
        if isinstance(exc, (MemoryError, tf.errors.ResourceExhaustedError)):
            return True
        return isinstance(exc, (RuntimeError, tf.errors.OpError)) and any(t in str(exc) for t in _OOM_TEXT)
