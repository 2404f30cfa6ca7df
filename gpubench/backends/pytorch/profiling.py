"""PyTorch profiling pieces: NVTX ranges, CUDA-event phase clock, the torch.profiler pass."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gpubench.files import write_atomic
from gpubench.measure.ops import OpRow

if TYPE_CHECKING:
    from gpubench.backends.pytorch.trainer import TorchTrainerBase

STEP_RANGE = "gpubench step"


class NvtxRanges:
    """NVTX ranges (Nsight Systems shows them on the CPU timeline above the kernels)."""

    def push(self, name: str) -> None:
        torch.cuda.nvtx.range_push(name)

    def pop(self) -> None:
        torch.cuda.nvtx.range_pop()


class CudaEventPhaseClock:
    """Phase times on the GPU's clock: an event recorded at each lap, waited for."""

    timing = "cuda_events"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._last: torch.cuda.Event | None = None

    def _event(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        event.synchronize()
        return event

    def start(self) -> None:
        torch.cuda.synchronize(self.device)
        self._last = self._event()

    def lap(self) -> float:
        event = self._event()
        assert self._last is not None  # start() comes first
        ms = self._last.elapsed_time(event)
        self._last = event
        return ms


def _device_us(event: Any) -> float:
    # self_device_time_total since torch 2.4 (self_cuda_time_total before, now deprecated)
    value = getattr(event, "self_device_time_total", None)
    return float(value if value is not None else getattr(event, "self_cuda_time_total", 0.0))


def op_rows(events: Any, cuda: bool) -> list[OpRow]:
    """torch.profiler's averaged events as rows. Device time is a kernel's own (rows whose
    device type is not the CPU's): a host operator's device figure is the time of the kernels
    it launched, which are rows of their own, so counting both would count the GPU's time
    twice (PyTorch's own table totals the kernel rows only). gpubench's step ranges are left
    out."""
    from torch.autograd import DeviceType

    def kernel(e: Any) -> bool:
        return getattr(e, "device_type", DeviceType.CPU) != DeviceType.CPU and not getattr(e, "is_user_annotation",
                                                                                              False)
    return [OpRow(name=e.key, calls=int(e.count), self_cpu_ms=e.self_cpu_time_total / 1000.0,
                  total_cpu_ms=e.cpu_time_total / 1000.0,
                  self_device_ms=_device_us(e) / 1000.0 if cuda and kernel(e) else None)
            for e in events if not e.key.startswith(STEP_RANGE) and not e.key.startswith("ProfilerStep")]


def profile_steps(trainer: TorchTrainerBase, steps: int, out_dir: Path) -> dict[str, Any]:
    """``steps`` steps under torch.profiler (CPU, and CUDA on a GPU), each in a
    ``gpubench step`` range; a Chrome/Perfetto trace and the per-operator self times."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if trainer.cuda else [])
    trainer.sync()
    with profile(activities=activities) as prof:
        for i in range(steps):
            with record_function(f"{STEP_RANGE} {i}"):
                trainer.step()
        trainer.sync()
    trace = out_dir / "trace.json"
    write_atomic(trace, lambda tmp: prof.export_chrome_trace(str(tmp)))
    ops = op_rows(prof.key_averages(), trainer.cuda)
    return {"profiler": f"torch.profiler ({', '.join(a.name for a in activities)})", "trace": trace, "ops": ops,
            "steps": steps}
