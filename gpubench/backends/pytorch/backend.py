"""The PyTorch backend: device and precision rules, probing, building trainers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpubench.backends.base import Backend, DeviceInfo, ProbeInfo, device_index, device_kind, parse_parallelism

if TYPE_CHECKING:
    from gpubench.backends.base import Trainer
    from gpubench.suite import Config
    from gpubench.workloads.base import WorkloadSpec
    from gpubench.workloads.data import Batches

_OOM_TEXT = ("out of memory", "can't allocate memory", "not enough memory")


class TorchBackend(Backend):
    name = "torch"
    install_hint = "pip install torch==2.13.0 (CPU build) or pip install 'gpubench[torch]'"

    def static_unsupported(self, config: Config) -> str | None:
        kind = device_kind(config.device)
        if config.compile == "xla":
            return "compile = xla is TensorFlow's XLA (jit_compile); PyTorch configs use compile = none"
        if kind == "cpu" and config.precision == "tf32":
            return "tf32 is a CUDA (Ampere or newer) math mode; on CPU use fp32 or amp-bf16"
        if kind == "cpu" and config.precision == "amp-fp16":
            return "amp-fp16 (float16 autocast with a gradient scaler) is for CUDA devices; on CPU use amp-bf16"
        parallel = parse_parallelism(config.parallelism)[0]
        if parallel == "ddp" and ":" in config.device:
            return f"ddp:N puts rank r on cuda:r; use device = cuda, not {config.device}"
        if parallel == "mirrored":
            return "mirrored:N is TensorFlow's MirroredStrategy; PyTorch's data parallelism is ddp:N (or dp:N)"
        if parallel == "dp" and kind == "cpu":
            return "dp:N (DataParallel) splits each batch over N GPUs; on CPU use ddp:N"
        if parallel == "dp" and ":" in config.device:
            return f"dp:N uses cuda:0..cuda:N-1; use device = cuda, not {config.device}"
        return None

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
        reason = self.static_unsupported(config)
        if reason:
            return ("unsupported", reason)
        import torch  # here, so that the worker's setup time does not include the import

        kind, n = parse_parallelism(config.parallelism)
        if kind == "ddp":
            import torch.distributed as dist

            if not dist.is_available():
                return ("unsupported", "this torch build has no torch.distributed")
            if device_kind(config.device) == "cuda" and not dist.is_nccl_available():
                return ("unsupported", "ddp on CUDA uses NCCL, which this torch build lacks")
        if kind in ("ddp", "dp") and device_kind(config.device) == "cuda" and torch.cuda.device_count() < n:
            return ("unavailable", f"{config.parallelism} needs {n} CUDA devices; this machine has "
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

    def build(self, spec: WorkloadSpec, config: Config, batches: Batches) -> Trainer:
        from gpubench.backends.pytorch.trainer import TorchTrainer

        return TorchTrainer(spec, config, batches)

    def device_uuid(self, config: Config) -> str | None:
        if device_kind(config.device) != "cuda":
            return None
        import torch

        uuid = getattr(torch.cuda.get_device_properties(device_index(config.device)), "uuid", None)
        return str(uuid) if uuid is not None else None

    def is_oom(self, exc: BaseException) -> bool:
        import torch

        oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                      getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
        if isinstance(exc, (MemoryError, *oom_types)):
            return True
        return isinstance(exc, RuntimeError) and any(t in str(exc) for t in _OOM_TEXT)
