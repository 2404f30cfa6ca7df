"""The PyTorch backend: device and precision rules, probing, building trainers."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpubench.backends.base import Backend, DeviceInfo, ProbeInfo, tensor_split_unsupported
from gpubench.backends.pytorch.modes import GRAPH_RESETTABLE_OPTIMIZERS, TORCH_COMPILE_MODES
from gpubench.options import (
    ATTENTION_WORKLOADS,
    PRECISIONS,
    Capabilities,
    RankStart,
    device_index,
    device_kind,
    parallel_form,
)
from gpubench.workloads import get_workload
from gpubench.workloads.base import TiedLMHead

if TYPE_CHECKING:
    from gpubench.backends.base import NativeModel, Trainer
    from gpubench.config import Config
    from gpubench.workloads.base import WorkloadSpec
    from gpubench.workloads.data import Batches

# also cuBLAS/cuDNN failing to create their handles or workspaces near the memory limit: raw
# cudaMalloc outside the caching allocator, which surfaces as a plain RuntimeError
_OOM_TEXT = ("out of memory", "can't allocate memory", "not enough memory", "CUBLAS_STATUS_ALLOC_FAILED",
             "CUDNN_STATUS_ALLOC_FAILED")

# the parallel kinds whose ranks are processes torchrun starts (and that talk through torch.distributed)
TORCHRUN_KINDS = ("ddp", "fsdp", "tp", "fsdp+tp", "pipeline")
SPLIT_KINDS = ("fsdp", "tp", "fsdp+tp")  # gpubench.backends.pytorch.sharding


def compile_unsupported(config: Config, input_ndim: int, workload: str) -> str | None:
    """Why PyTorch cannot run this compile / memory-format combination (static rules)."""
    parallel = config.parallel.kind
    if config.compile in TORCH_COMPILE_MODES and parallel == "dp":
        return "torch.compile with dp:N (DataParallel re-replicates the module every step) is not supported; use ddp:N"
    if config.compile == "torch-compile-reduce-overhead" and device_kind(config.device) == "cpu":
        return ("torch-compile-reduce-overhead adds CUDA graphs to torch-compile; on CPU it is the same as "
                "torch-compile: use that")
    if config.compile == "cuda-graph":
        if device_kind(config.device) == "cpu":
            return "cuda-graph captures CUDA kernels; on CPU use none or torch-compile"
        if config.data == "pipeline":
            return ("cuda-graph replays a fixed set of kernels; the input pipeline's per-batch host work cannot be "
                    "replayed: use data = device")
        if parallel in ("ddp", "dp", *SPLIT_KINDS):
            return f"cuda-graph capture of a {config.parallelism} step is not supported; use single or grad-accum:N"
        if config.precision == "amp-fp16":
            return ("cuda-graph with amp-fp16: GradScaler's step synchronises with the host, which graph capture "
                    "forbids; use amp-bf16 (no scaler)")
        if config.checkpointing != "none":
            return ("cuda-graph with checkpointing = activations is not supported: each recomputation saves and "
                    "restores the RNG state and batch-norm buffers from the host")
        if config.optimizer not in GRAPH_RESETTABLE_OPTIMIZERS:
            return f"cuda-graph supports the optimizers {', '.join(GRAPH_RESETTABLE_OPTIMIZERS)}"
        if config.lr_warmup_steps:
            return ("cuda-graph with lr_warmup_steps: the captured optimizer step replays its learning rate; a "
                    "warm-up changes it every step")
    if config.memory_format == "channels-last" and input_ndim != 3:
        return (f"memory_format = channels-last is a layout of 4-D (N, C, H, W) tensors; {workload} takes a "
                f"{input_ndim}-D sample, not (C, H, W)")
    return None


def compiler_missing(config: Config) -> str | None:
    """Why torch.compile cannot compile here (no Triton for CUDA, no C++ compiler for CPU)."""
    if config.compile not in TORCH_COMPILE_MODES:
        return None
    if device_kind(config.device) == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "torch.compile on CUDA needs Triton, which is not installed"
    import os
    import shutil

    if not any(shutil.which(c) for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c):
        return "torch.compile on CPU needs a C++ compiler (g++ or clang++) on PATH"
    return None


def attention_unsupported(config: Config) -> str | None:
    """The attention kernels PyTorch has where the config runs (it uses none but its transformers'):
    cuDNN's and the memory-efficient one are CUDA kernels; FlashAttention on CUDA and cuDNN's run
    float16 or bfloat16 inputs only (a mixed precision)."""
    if not config.uses("attention"):
        return None
    kind, half = device_kind(config.device), config.precision in ("amp-fp16", "amp-bf16")
    if config.attention in ("cudnn", "efficient") and kind == "cpu":
        return (f"attention = {config.attention} is a CUDA kernel; on CPU PyTorch offers sdpa, math and flash "
                "(its CPU FlashAttention)")
    if config.attention in ("flash", "cudnn") and kind == "cuda" and not half:
        return (f"attention = {config.attention} runs float16 or bfloat16 on CUDA; use precision amp-bf16 or "
                f"amp-fp16 (at {config.precision}: sdpa, math or efficient)")
    return None


def sharded_unsupported(config: Config, kind: str) -> str | None:
    """The rules of ``fsdp:N``, ``tp:N`` and ``fsdp:A+tp:B`` that need no import (the model's
    blocks and projections are checked when it is built)."""
    form = parallel_form(kind)
    if config.precision == "amp-fp16":
        return (f"amp-fp16 needs a gradient scaler whose overflow check spans every rank's shard; {form} runs "
                "fp32, tf32 or amp-bf16")
    if config.checkpointing != "none":
        return (f"{form} with checkpointing = activations: gpubench checkpoints runs of a Sequential's layers, "
                "which cut across the blocks that sharding wraps (use checkpointing = none)")
    if "tp" in kind and ":" not in config.workload:
        if config.workload not in ATTENTION_WORKLOADS:
            return (f"{form} splits a transformer's attention and MLP projections; {config.workload} has none (the "
                    f"built-in transformers: {', '.join(sorted(ATTENTION_WORKLOADS))}; use fsdp:N or ddp:N)")
        return tensor_split_unsupported(config, config.parallel.size("tp"))  # before torchrun starts
    return None


def pipeline_unsupported(config: Config) -> str | None:
    """The rules of ``pipeline:N`` that need no import: devices, precision, data, batch split."""
    n = config.parallel.n
    m = config.pipeline_microbatches
    if ":" in config.device:
        return f"pipeline:N puts stage r on cuda:r; use device = cuda, not {config.device}"
    if config.precision == "amp-fp16":
        return ("amp-fp16 needs a gradient scaler whose overflow check spans every stage; pipeline:N runs fp32, "
                "tf32 or amp-bf16")
    if config.data == "pipeline":
        return "pipeline:N feeds device-resident batches to its first stage; use data = device"
    if config.compile != "none" or config.memory_format != "contiguous" or config.checkpointing != "none":
        return ("pipeline:N runs its stages eagerly in the contiguous format without checkpointing; compile, "
                "memory_format and checkpointing apply to the other strategies (use compile = none, "
                "memory_format = contiguous, checkpointing = none)")
    if isinstance(config.batch_size, int) and config.batch_size % m:  # "max": checked again once resolved
        return (f"pipeline:N splits each batch into pipeline_microbatches = {m} equal micro-batches; batch_size "
                f"{config.batch_size} is not a multiple of {m}")
    if config.pipeline_schedule == "1f1b" and m < n * config.nnodes:
        return (f"the 1f1b schedule needs at least as many micro-batches as stages; pipeline_microbatches = {m} < "
                f"{n * config.nnodes}")
    if ":" in config.workload:
        return (f"pipeline:N splits a built-in workload's layers into stages; {config.workload} is not one (use "
                "ddp:N, dp:N or grad-accum:N)")
    spec = get_workload(config.workload).spec(**dict(config.workload_params))
    layers = len(spec.layers)
    if any(isinstance(layer, TiedLMHead) for layer in spec.layers):
        return (f"{config.workload_label}'s output head is tied to its token embedding, which would sit on the "
                "first stage and the head on the last (their shared weight is not split across stages here); use "
                "ddp:N or grad-accum:N")
    if layers < n * config.nnodes:
        return f"{config.workload_label} has {layers} top-level layers, fewer than the {n * config.nnodes} stages"
    return None


class TorchBackend(Backend):
    name = "torch"
    install_hint = ("pip install torch (PyPI's CUDA build; for the CPU build add --index-url "
                    "https://download.pytorch.org/whl/cpu)")
    display_name = "PyTorch"
    calibration_module = "gpubench.backends.pytorch.calibration"
    zoos = ("torchvision", "timm", "hf")
    loader_workers = True  # data_workers: the DataLoader's worker processes
    # imported, torch starts no thread and no CUDA context; torch._dynamo is what building any
    # optimizer imports (torch.optim wraps its __init__ in torch._disable_dynamo)
    fork_preload = ("torch", "torch._dynamo")
    auto_optimizer_impl = {"cuda": "fused"}
    input_notes = {"pinned memory": "gpubench's PyTorch DataLoader pins host batches whenever the device is CUDA; "
                                    "nothing to turn on"}

    @classmethod
    def package_build(cls) -> dict[str, Any] | None:
        """torch's version, CUDA build and git revision from its version.py, without importing it;
        None when torch is not installed."""
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(list(spec.submodule_search_locations)[0]) / "version.py"
        values: dict[str, Any] = {"version": None, "cuda": None, "git_version": None}
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            return values
        names = {"__version__": "version", "cuda": "cuda", "git_version": "git_version"}
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            value = getattr(node, "value", None)
            if isinstance(target, ast.Name) and target.id in names and isinstance(value, ast.Constant):
                values[names[target.id]] = value.value
        return values

    @classmethod
    def calibration_key(cls) -> dict[str, Any]:
        """torch's version, CUDA build and git revision: cuBLAS and oneDNN ship with torch."""
        build = cls.package_build() or {}
        return {"torch": build.get("version"), "torch_cuda": build.get("cuda"), "torch_git": build.get("git_version")}
    uncompiled = "eager"
    colours = {"fp32": "#1f77b4", "tf32": "#6baed6", "amp-fp16": "#08306b", "amp-bf16": "#17becf"}  # noqa: RUF012
    capabilities = Capabilities(
        precisions={"cpu": ("fp32", "amp-bf16"), "cuda": PRECISIONS},
        parallelism=("single", "grad-accum", "ddp", "dp", *SPLIT_KINDS, "pipeline"),
        compile=("none", *TORCH_COMPILE_MODES, "cuda-graph"),
        memory_format=("contiguous", "channels-last"),
        data=("device", "pipeline"),
        checkpointing=("none", "activations"),
        others={"attention": ("math", "sdpa", "flash", "efficient", "cudnn"),
                "optimizer_impl": ("auto", "for-loop", "foreach", "fused")},
        notes={
            "precision=tf32": "tf32 is a CUDA (Ampere or newer) math mode; on CPU use fp32 or amp-bf16",
            "precision=amp-fp16": "float16 autocast with a gradient scaler is for CUDA devices; on CPU use amp-bf16",
            "compile=xla": "xla is TensorFlow's XLA (jit_compile)",
            "parallelism=mirrored": "mirrored:N is TensorFlow's MirroredStrategy; PyTorch's data parallelism is "
                                    "ddp:N (or dp:N)",
            "parallelism=multiworker": "multiworker:N is TensorFlow's MultiWorkerMirroredStrategy; PyTorch's data "
                                       "parallelism is ddp:N",
        },
        # PyTorch's elastic launcher (torchrun) starts each node's N ranks
        rank_start={k: RankStart(node_module="torch.distributed.run") for k in TORCHRUN_KINDS},
        # torch.compile, with its CUDA graphs on a GPU where the config allows them
        best_compile={"cpu": ("torch-compile",), "cuda": ("torch-compile-reduce-overhead", "torch-compile")})

    def static_unsupported(self, config: Config) -> str | None:
        kind = device_kind(config.device)
        parallel = config.parallel.kind
        if parallel in ("ddp", *SPLIT_KINDS) and ":" in config.device:
            return f"{parallel_form(parallel)} puts rank r on cuda:r; use device = cuda, not {config.device}"
        if (reason := attention_unsupported(config)) is not None:
            return reason
        if parallel in SPLIT_KINDS and (reason := sharded_unsupported(config, parallel)) is not None:
            return reason
        if parallel == "pipeline":
            return pipeline_unsupported(config)
        if parallel == "dp" and kind == "cpu":
            return "dp:N (DataParallel) splits each batch over N GPUs; on CPU use ddp:N"
        if parallel == "dp" and ":" in config.device:
            return f"dp:N uses cuda:0..cuda:N-1; use device = cuda, not {config.device}"
        if ":" in config.workload:  # a factory's or zoo's model: its input is known once it is built
            return compile_unsupported(config, len(config.input_shape) or 3, config.workload)
        spec = get_workload(config.workload).spec(**dict(config.workload_params))
        return compile_unsupported(config, len(spec.input_shape), spec.name)

    def probe(self) -> ProbeInfo:
        import torch

        from gpubench.env import cpu_model

        devices = [DeviceInfo("cpu", cpu_model())]
        build = {
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "num_threads": torch.get_num_threads(),
            "num_interop_threads": torch.get_num_interop_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        }
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                devices.append(DeviceInfo(f"cuda:{i}", props.name, int(props.total_memory)))
        return ProbeInfo("torch", True, version=torch.__version__, devices=tuple(devices), build=build)

    def check(self, config: Config) -> tuple[str, str] | None:
        reason = self.unsupported(config)
        if reason:
            return ("unsupported", reason)
        import torch  # here, so that the worker's setup time does not include the import

        reason = compiler_missing(config)
        if reason:
            return ("unavailable", reason)

        kind, n = config.parallel.kind, config.parallel.n
        if kind in TORCHRUN_KINDS:
            import torch.distributed as dist

            if not dist.is_available():
                return ("unsupported", "this torch build has no torch.distributed")
            if device_kind(config.device) == "cuda" and not dist.is_nccl_available():
                return ("unsupported", f"{kind} on CUDA uses NCCL, which this torch build lacks")
        modules = {"pipeline": ("torch.distributed.pipelining", "2.4"), "fsdp": ("torch.distributed.fsdp", "2.6"),
                   "tp": ("torch.distributed.tensor.parallel", "2.4")}
        for part in (part for part, _ in config.parallel.axes if part in modules):
            try:
                module = importlib.import_module(modules[part][0])
                if part == "fsdp":
                    module.fully_shard  # noqa: B018 - FSDP2's entry point
            except (ImportError, AttributeError) as e:
                return ("unsupported", f"{parallel_form(kind)} needs {modules[part][0]} (torch {modules[part][1]} "
                                       f"or newer): {e}")
        if (kind in (*TORCHRUN_KINDS, "dp") and device_kind(config.device) == "cuda"
                and torch.cuda.device_count() < n):
            where = "this machine" if config.nnodes == 1 else "this node"
            return ("unavailable", f"{config.parallelism} needs {n} CUDA devices; {where} has "
                                   f"{torch.cuda.device_count()}")
        if device_kind(config.device) != "cuda":
            return None
        if not torch.cuda.is_available():
            return ("unavailable", f"no CUDA device here (torch {torch.__version__}, CUDA build {torch.version.cuda})")
        count = torch.cuda.device_count()
        if device_index(config.device) >= count:
            return ("unavailable", f"{config.device} requested; this machine has {count} CUDA device(s)")
        major, minor = torch.cuda.get_device_capability(device_index(config.device))
        if config.precision == "tf32" and major < 8:
            return ("unsupported", f"tf32 needs compute capability 8.0 or newer; this GPU is sm_{major}{minor}")
        if config.precision == "amp-bf16" and not torch.cuda.is_bf16_supported():
            return ("unsupported", f"this GPU (sm_{major}{minor}) has no bfloat16 support")
        return None

    def set_threads(self, n: int) -> str | None:
        import torch

        torch.set_num_threads(n)  # intra-op: the threads one operator's work is split over
        return None

    def native(self, config: Config, counts: Path | None = None, count: bool = True) -> NativeModel:
        from gpubench.backends.pytorch.native import native_model

        return native_model(config, counts, count)

    def build(self, model: NativeModel | WorkloadSpec, config: Config, batches: Batches) -> Trainer:
        from gpubench.backends.pytorch.native import as_native

        model = as_native(model, config)
        if config.pipelined:
            from gpubench.backends.pytorch.pipeline import PipelineTrainer

            assert model.spec is not None  # pipeline:N is refused for other models (pipeline_unsupported)
            return PipelineTrainer(model.spec, config, batches)
        from gpubench.backends.pytorch.trainer import TorchTrainer

        return TorchTrainer(model, config, batches)

    def device_uuids(self, config: Config) -> list[str | None]:
        if not config.local_cuda_ordinals:
            return []
        import torch

        uuids = [getattr(torch.cuda.get_device_properties(i), "uuid", None) for i in config.local_cuda_ordinals]
        return [str(u) if u is not None else None for u in uuids]

    def before_profiled_build(self, config: Config) -> None:
        # CUPTI must be initialised before a CUDA graph is captured, or replays of that graph
        # under the profiler show no kernels (PyTorch's own helper for this: pytorch#100441);
        # the trainer captures cuda-graph and Inductor's reduce-overhead graphs as it is built
        # or warms up, before the profiling passes start
        if not config.local_cuda_ordinals:
            return
        try:
            from torch.profiler._utils import _init_for_cuda_graphs
        except ImportError:  # a torch without the helper
            return
        _init_for_cuda_graphs()

    def memory_history_problem(self, config: Config) -> str | None:
        if not config.local_cuda_ordinals:
            return (f"device = {config.device}: the history recorded is the CUDA caching allocator's; a CPU config "
                    "has none")
        return None

    def start_memory_history(self, config: Config, max_entries: int) -> None:
        import torch

        # Python stacks only: symbolising C++ frames for every entry makes the snapshot take minutes
        torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")

    def stop_memory_history(self, config: Config) -> None:
        import torch

        torch.cuda.memory._record_memory_history(enabled=None)

    def allocator_snapshot(self, config: Config) -> dict[str, Any] | None:
        import torch

        if not config.local_cuda_ordinals or not torch.cuda.is_available():
            return None
        return torch.cuda.memory._snapshot()

    def is_oom(self, exc: BaseException) -> bool:
        import torch

        oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                      getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
        if isinstance(exc, (MemoryError, *oom_types)):
            return True
        text = str(exc)
        # a cuBLAS handle created near the memory limit (autograd's thread makes its own at the
        # first backward, when activations peak) fails as "not initialized": an OOM symptom
        return isinstance(exc, RuntimeError) and (any(t in text for t in _OOM_TEXT) or (
            "CUBLAS_STATUS_NOT_INITIALIZED" in text and "cublasCreate" in text))
