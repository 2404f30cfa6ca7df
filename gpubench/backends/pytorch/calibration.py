"""PyTorch's calibration child: ``python -m gpubench.backends.pytorch.calibration DEVICE`` times
PyTorch's training kernels on one device, and its memory-copy bandwidth (PyTorch is the
reference framework: its child is the one calibration cannot do without), and prints one JSON
object (the method: gpubench.measure.kernels).

The kernels: ``F.linear`` and ``F.conv2d`` (channels-last), under ``torch.autocast`` for fp16
and bf16 with float32 weights cast on every call (as the trainer's parameters are, once per
step) and inputs already in the low precision (as a previous autocast layer leaves them); on a
GPU also ``torch.mm`` on tensors of the precision (cuBLAS).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from types import ModuleType
from typing import Any

from gpubench.measure.kernels import (
    DTYPES,
    LOW_PRECISIONS,
    PLANS,
    Call,
    HostClock,
    Kernel,
    Plan,
    available_devices,
    capability_gaps,
    run_kernel,
    sustained,
)
from gpubench.options import device_index, device_kind

# the operations timed, per device kind
OPS = {"cpu": ("linear", "conv2d"), "cuda": ("mm", "linear", "conv2d")}


class CudaClock(HostClock):
    """CUDA events around the block: no host synchronisation inside it."""

    def __init__(self, torch: ModuleType) -> None:
        self.torch = torch

    def time(self, fn: Call, n: int, sync: Call | None = None) -> float:
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0


def _set_tf32(torch: ModuleType, device: str, precision: str) -> None:
    """fp32 is true fp32 on a GPU (TF32 off for matmuls and cuDNN); tf32 turns it on."""
    if device_kind(device) == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"


def torch_kernels(torch: ModuleType, device: str, plan: Plan, precisions: list[str]) -> list[Kernel]:
    """The plan's PyTorch kernels at each precision."""
    import contextlib

    import torch.nn.functional as F

    kind = device_kind(device)

    def autocast(precision: str) -> Callable[[], Any]:
        if precision not in LOW_PRECISIONS:
            return contextlib.nullcontext
        dtype = getattr(torch, DTYPES[precision])
        return lambda: torch.autocast(device_type=kind, dtype=dtype)

    def mm(precision: str) -> Callable[[int], tuple[Call, None]]:
        def prepare(n: int) -> tuple[Call, None]:
            _set_tf32(torch, device, precision)
            dtype = getattr(torch, DTYPES[precision])
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            c = torch.empty(n, n, device=device, dtype=dtype)
            return (lambda: torch.mm(a, b, out=c)), None
        return prepare

    def linear(precision: str) -> Callable[[int], tuple[Call, None]]:
        ctx = autocast(precision)

        def prepare(n: int) -> tuple[Call, None]:
            _set_tf32(torch, device, precision)
            x = torch.randn(n, n, device=device).to(getattr(torch, DTYPES[precision]))
            w = torch.randn(n, n, device=device, requires_grad=True)  # a float32 parameter

            def call() -> None:
                with ctx():
                    F.linear(x, w)
            return call, None
        return prepare

    def conv2d(precision: str) -> Callable[[int], tuple[Call, None]]:
        ctx, s = autocast(precision), plan.conv
        last = torch.channels_last

        def prepare(batch: int) -> tuple[Call, None]:
            _set_tf32(torch, device, precision)
            x = torch.randn(batch, s.channels_in, s.hw, s.hw, device=device).to(
                getattr(torch, DTYPES[precision])).contiguous(memory_format=last)
            w = torch.randn(s.channels_out, s.channels_in, s.kernel, s.kernel, device=device).contiguous(
                memory_format=last).requires_grad_()

            def call() -> None:
                with ctx():
                    F.conv2d(x, w, padding=s.kernel // 2)
            return call, None
        return prepare

    square = (lambda n: 2.0 * n**3, lambda n: f"{n}x{n}x{n}", plan.matmul_sizes)  # flops, shape, sizes
    makers = {"mm": (mm, *square), "linear": (linear, *square),
              "conv2d": (conv2d, plan.conv.flops, plan.conv.describe, plan.conv_batches)}
    return [Kernel("torch", op, precision, sizes, flops, shape, make(precision))
            for precision in precisions for op in OPS[kind] for make, flops, shape, sizes in [makers[op]]]


def _copy(torch: ModuleType, device: str, plan: Plan, clock: HostClock) -> dict[str, Any]:
    nbytes = plan.copy_bytes
    if device_kind(device) == "cuda":
        free, _ = torch.cuda.mem_get_info(device_index(device))
        nbytes = min(nbytes, free // 4)
    src = torch.rand(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    per_call, calls = sustained(clock, lambda: dst.copy_(src), plan)
    moved = 2 * src.nelement() * src.element_size()  # read + written
    gbs = [moved / s / 1e9 for s in per_call]
    return {"kernel": "torch copy_", "gbs": statistics.median(gbs), "bytes_moved_per_copy": moved,
            "blocks_gbs": gbs, "calls_per_block": calls}


def unsupported_precisions(torch: ModuleType, device: str) -> dict[str, str]:
    if device_kind(device) != "cuda":
        return {}
    major, minor = torch.cuda.get_device_capability(device_index(device))
    return capability_gaps(major, minor, torch.cuda.is_bf16_supported())


def measure(device: str) -> dict[str, Any]:
    """PyTorch's figures for one device (``cpu`` or ``cuda:N``), as a JSON-able dict."""
    import torch

    kind = device_kind(device)
    plan = PLANS[kind]
    info: dict[str, Any] = {"device": device, "framework": {"name": "torch", "version": torch.__version__,
                                                            "cuda": torch.version.cuda,
                                                            "num_threads": torch.get_num_threads()}}
    if kind == "cuda":
        if not torch.cuda.is_available():
            return {**info, "error": f"no such device here; available: {available_devices(0)} (torch "
                                      f"{torch.__version__}, CUDA build {torch.version.cuda})"}
        if device_index(device) >= torch.cuda.device_count():
            return {**info, "error": f"no such device here; available: {available_devices(torch.cuda.device_count())}"}
        torch.cuda.set_device(device_index(device))
        torch.backends.cudnn.benchmark = True  # as the trainer: the untimed first call picks the algorithm
        props = torch.cuda.get_device_properties(device_index(device))
        uuid = getattr(props, "uuid", None)
        info.update(device_name=props.name, device_uuid=str(uuid) if uuid is not None else None)
        clock: HostClock = CudaClock(torch)
    else:
        from gpubench.env import cpu_model

        info.update(device_name=cpu_model(), device_uuid=None)
        clock = HostClock()
    t0 = time.perf_counter()
    skipped = unsupported_precisions(torch, device)
    precisions = [p for p in plan.precisions if p not in skipped]
    with torch.no_grad():
        if plan.warmup_s > 0:  # let the clocks ramp up before anything is timed
            n = plan.matmul_sizes[len(plan.matmul_sizes) // 2]
            a = torch.randn(n, n, device=device)
            end = time.perf_counter() + plan.warmup_s
            while time.perf_counter() < end:
                clock.time(lambda: torch.mm(a, a), 4)
            del a
        kernels = [run_kernel(k, plan, clock) for k in torch_kernels(torch, device, plan, precisions)]
        copy = _copy(torch, device, plan, clock)
    return {**info, "kernels": kernels, "memory_bandwidth_gbs": copy["gbs"], "copy": copy, "skipped": skipped,
            "plan": asdict(plan), "seconds": time.perf_counter() - t0}


def main(argv: list[str]) -> int:
    device = argv[0]
    try:
        result = measure(device)
    except ImportError as e:
        result = {"device": device, "error": f"torch is not installed ({e})", "missing_reference": True}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
