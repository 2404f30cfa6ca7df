"""PyTorch profiling pieces: NVTX ranges, CUDA-event phase clock, the torch.profiler pass."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.profiler import ProfilerAction

from gpubench.files import write_atomic
from gpubench.measure.ops import OpRow
from gpubench.measure.trainer import Trainer

if TYPE_CHECKING:
    from torch.autograd.profiler_util import FunctionEventAvg


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


def _device_us(event: FunctionEventAvg) -> float:
    # self_device_time_total since torch 2.4 (self_cuda_time_total before, now deprecated)
    value = getattr(event, "self_device_time_total", None)
    return float(value if value is not None else getattr(event, "self_cuda_time_total", 0.0))


def op_rows(events: Iterable[FunctionEventAvg], cuda: bool) -> list[OpRow]:
    """torch.profiler's averaged events as rows. Device time is a kernel's own (rows whose
    device type is not the CPU's): a host operator's device figure is the time of the kernels
    it launched, which are rows of their own, so counting both would count the GPU's time
    twice (PyTorch's own table totals the kernel rows only). The ``ProfilerStep#<i>`` ranges are
    left out."""
    from torch.autograd import DeviceType

    def kernel(e: FunctionEventAvg) -> bool:
        return getattr(e, "device_type", DeviceType.CPU) != DeviceType.CPU and not getattr(e, "is_user_annotation",
                                                                                              False)
    return [OpRow(name=e.key, calls=int(e.count), self_cpu_ms=e.self_cpu_time_total / 1000.0,
                  total_cpu_ms=e.cpu_time_total / 1000.0,
                  self_device_ms=_device_us(e) / 1000.0 if cuda and kernel(e) else None)
            for e in events if e.key is not None and not e.key.startswith("ProfilerStep")]


TRACE_DIR = "torch"  # profile/<config_id>/torch/: the trace alone, as HTA's trace_dir wants


def trace_name(rank: int) -> str:
    """``rank<r>.pt.trace.json``: TensorBoard's PyTorch profiler plugin takes a directory holding
    ``*.pt.trace.json`` files for a run (the part before the suffix names the worker), and HTA
    reads one file per rank from a directory holding traces only (every ``.json`` in it)."""
    return f"rank{rank}.pt.trace.json"


def step_schedule(steps: int) -> Callable[[int], ProfilerAction]:
    """Record steps 0..steps-1 and save at the last. A schedule is what makes torch.profiler
    wrap each step in a ``ProfilerStep#<n>`` range (HTA's and TensorBoard's iterations); no
    warm-up step, so the ranks that are not profiled take the same number of steps (their
    collectives) and the profiler starts as it did without a schedule."""
    def action(step: int) -> ProfilerAction:
        if step < steps - 1:
            return ProfilerAction.RECORD
        return ProfilerAction.RECORD_AND_SAVE if step == steps - 1 else ProfilerAction.NONE
    return action


def distributed_info(trainer: Trainer) -> dict[str, Any] | None:
    """The trace's ``distributedInfo`` where torch.profiler writes none: it writes its own
    (backend, rank, world size, process groups) only when torch.distributed is initialised,
    while HTA reads every trace's rank from this block (a single process: rank 0 of 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return None
    return {"rank": trainer.rank, "world_size": trainer.world_size}


def profile_steps(trainer: Trainer, steps: int, out_dir: Path, cuda: bool = False) -> dict[str, Any]:
    """``steps`` steps under torch.profiler (CPU, and CUDA with ``cuda``), each a ``ProfilerStep#<i>``
    (``prof.step()`` between steps: no host sync, the device is synchronised once, at the end
    of the last step); the trace (``torch/rank<r>.pt.trace.json``, with ``distributedInfo``)
    and the per-operator self times."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities, schedule=step_schedule(steps))
    info = distributed_info(trainer)
    if info is not None:
        prof.preset_metadata_json("distributedInfo", json.dumps(info))
    trainer.sync()
    with prof:
        for i in range(steps):
            trainer.step()
            if i == steps - 1:
                trainer.sync()  # the last step's kernels, before the profiler stops
            prof.step()
    trace_dir = out_dir / TRACE_DIR
    trace_dir.mkdir(exist_ok=True)
    trace = trace_dir / trace_name(trainer.rank)
    try:
        write_atomic(trace, lambda tmp: prof.export_chrome_trace(str(tmp)))
    except BaseException:
        with contextlib.suppress(OSError):
            trace_dir.rmdir()  # only if empty: a failed export leaves nothing behind
        raise
    ops = op_rows(prof.key_averages(), cuda)
    return {"profiler": f"torch.profiler ({', '.join(a.name for a in activities)})", "trace": trace, "ops": ops,
            "steps": steps}
