"""The calibration child: ``python -m gpubench.calibrate.measure DEVICE`` measures one device's
dense matmul FLOP/s per precision and its memory-copy bandwidth with PyTorch, and prints one
JSON object. It runs in a throw-away process (the pattern of gpubench.runner.probe), so the
parent never imports torch or creates a CUDA context.

Method (README, "Calibration"):
- random data (normal for matmuls, uniform for copies), never zeros: multiplying zeros draws
  less power, so a power-capped GPU holds higher clocks on them, and Ampere and newer GPUs
  compress zero-filled memory traffic; zeros would overstate both peaks;
- per precision, square matmuls ``C = A @ B`` (``2 n^3`` FLOPs) of a few sizes; each size:
  one untimed call (lazy initialisation, cuBLAS heuristics), one call to estimate its time,
  then ``blocks`` timed blocks of back-to-back calls lasting about ``block_s`` each (CUDA
  events around a block on a GPU, ``perf_counter`` on the CPU). A size's figure is its median
  block (a sustained rate, not one lucky block); the precision's peak is the best size's;
- bandwidth: ``dst.copy_(src)`` of a large buffer, bytes read + written, timed the same way;
- on a GPU, about ``warmup_s`` of matmuls first, so that clocks have ramped up.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from gpubench.options import device_index, device_kind

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Plan:
    precisions: tuple[str, ...]
    sizes: tuple[int, ...]  # square matmul sizes, smallest first
    block_s: float  # target duration of one timed block
    blocks: int
    budget_s: float  # per precision: no larger size is started once this much time is spent
    copy_bytes: int  # size of the copied buffer (the copy moves twice this: read + write)
    warmup_s: float


# CPU: a few seconds in total (CI runs it); GPU: sizes up to 16384, where an H100 reaches its
# bf16 peak, and a 1 GiB copy (hundreds of microseconds on HBM, far beyond the L2 cache)
PLANS = {
    "cpu": Plan(("fp32", "bf16"), (512, 1024, 2048), block_s=0.05, blocks=3, budget_s=1.0,
                copy_bytes=256 << 20, warmup_s=0.0),
    "cuda": Plan(PRECISIONS, (2048, 4096, 8192, 16384), block_s=0.1, blocks=5, budget_s=60.0,
                 copy_bytes=1 << 30, warmup_s=1.0),
}


class _Clock:
    """Seconds taken by ``n`` back-to-back calls: CUDA events on a GPU (no host sync inside the
    block), ``perf_counter`` on the CPU."""

    def __init__(self, torch: Any, device: str) -> None:
        self.torch = torch
        self.cuda = device_kind(device) == "cuda"

    def time(self, fn: Callable[[], None], n: int) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return time.perf_counter() - t0
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0


def sustained(clock: _Clock, fn: Callable[[], None], plan: Plan) -> tuple[list[float], int]:
    """(seconds per call in each timed block, calls per block)."""
    clock.time(fn, 1)  # lazy initialisation, autotuning: not timed
    estimate = max(clock.time(fn, 1), 1e-9)
    calls = max(1, round(plan.block_s / estimate))
    return [clock.time(fn, calls) / calls for _ in range(plan.blocks)], calls


def _matmul(torch: Any, device: str, precision: str, plan: Plan, clock: _Clock) -> dict[str, Any]:
    """The best sustained TFLOP/s over the plan's sizes, and every size's figures."""
    if device_kind(device) == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"  # fp32 is true fp32
    dtype = getattr(torch, _DTYPES[precision])
    sizes: list[dict[str, Any]] = []
    note = ""
    t0 = time.perf_counter()
    for n in plan.sizes:
        if time.perf_counter() - t0 > plan.budget_s:
            note = f"sizes above {sizes[-1]['size']} skipped (time budget {plan.budget_s:g} s)"
            break
        try:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            c = torch.empty(n, n, device=device, dtype=dtype)
            per_call, calls = sustained(clock, lambda: torch.mm(a, b, out=c), plan)
        except RuntimeError as e:  # out of memory at a large size: keep the sizes that ran
            note = f"size {n}: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            break
        finally:
            a = b = c = None
        tflops = [2 * n**3 / s / 1e12 for s in per_call]
        sizes.append({"size": n, "tflops": statistics.median(tflops), "blocks_tflops": tflops,
                      "calls_per_block": calls})
    if not sizes:
        raise RuntimeError(f"no matmul size ran for {precision}: {note}")
    return {"tflops": max(s["tflops"] for s in sizes), "sizes": sizes, "note": note}


def _copy(torch: Any, device: str, plan: Plan, clock: _Clock) -> dict[str, Any]:
    nbytes = plan.copy_bytes
    if device_kind(device) == "cuda":
        free, _ = torch.cuda.mem_get_info(device_index(device))
        nbytes = min(nbytes, free // 4)
    src = torch.rand(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    per_call, calls = sustained(clock, lambda: dst.copy_(src), plan)
    moved = 2 * src.nelement() * src.element_size()  # read + written
    gbs = [moved / s / 1e9 for s in per_call]
    return {"gbs": statistics.median(gbs), "bytes_moved_per_copy": moved, "blocks_gbs": gbs, "calls_per_block": calls}


def unsupported_precisions(torch: Any, device: str) -> dict[str, str]:
    if device_kind(device) != "cuda":
        return {}
    major, minor = torch.cuda.get_device_capability(device_index(device))
    out = {}
    if major < 8:
        out["tf32"] = f"tf32 needs compute capability 8.0 or newer; this GPU is sm_{major}{minor}"
    if not torch.cuda.is_bf16_supported():
        out["bf16"] = f"this GPU (sm_{major}{minor}) has no bfloat16 support"
    return out


def available_devices(n_cuda: int) -> str:
    """``cpu``, ``cpu, cuda:0`` or ``cpu, cuda:0..3``: what ``--device`` can name here."""
    return "cpu" + ("" if n_cuda == 0 else ", cuda:0" if n_cuda == 1 else f", cuda:0..{n_cuda - 1}")


def measure(device: str) -> dict[str, Any]:
    """Every figure for one device (``cpu`` or ``cuda:N``), as a JSON-able dict."""
    import torch

    kind = device_kind(device)
    plan = PLANS[kind]
    info: dict[str, Any] = {"device": device, "torch": {"version": torch.__version__, "cuda": torch.version.cuda,
                                                        "num_threads": torch.get_num_threads()}}
    if kind == "cuda":
        if not torch.cuda.is_available():
            return {**info, "error": f"no such device here; available: {available_devices(0)} (torch "
                                      f"{torch.__version__}, CUDA build {torch.version.cuda})"}
        if device_index(device) >= torch.cuda.device_count():
            return {**info, "error": f"no such device here; available: {available_devices(torch.cuda.device_count())}"}
        torch.cuda.set_device(device_index(device))
        props = torch.cuda.get_device_properties(device_index(device))
        uuid = getattr(props, "uuid", None)
        info.update(device_name=props.name, device_uuid=str(uuid) if uuid is not None else None)
    else:
        from gpubench.env import cpu_model

        info.update(device_name=cpu_model(), device_uuid=None)
    t0 = time.perf_counter()
    clock = _Clock(torch, device)
    skipped = unsupported_precisions(torch, device)
    precisions = [p for p in plan.precisions if p not in skipped]
    if plan.warmup_s > 0:  # let the clocks ramp up before anything is timed
        n = plan.sizes[len(plan.sizes) // 2]
        a = torch.randn(n, n, device=device)
        end = time.perf_counter() + plan.warmup_s
        while time.perf_counter() < end:
            clock.time(lambda: torch.mm(a, a), 4)
        del a
    matmul = {p: _matmul(torch, device, p, plan, clock) for p in precisions}
    copy = _copy(torch, device, plan, clock)
    return {
        **info,
        "matmul_tflops": {p: m["tflops"] for p, m in matmul.items()},
        "memory_bandwidth_gbs": copy["gbs"],
        "skipped": skipped,
        "details": {"matmul": matmul, "copy": copy},
        "plan": asdict(plan),
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str]) -> int:
    device = argv[0]
    try:
        result = measure(device)
    except ImportError as e:
        result = {"device": device, "error": f"torch is not installed ({e})", "missing_torch": True}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
