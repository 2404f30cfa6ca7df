"""How gpubench times a framework's training kernels for the device peaks (``gpubench
calibrate``), framework-neutral: the plan of sizes per device kind, a kernel (one operation at
one precision over sizes), the clock, and the sustained-rate method. Each backend declares its
kernels in a calibration module of its own (``Backend.calibration_module``), run as a
throw-away process (``python -m MODULE DEVICE``, one JSON object on stdout), so the parent
never imports a framework or creates a CUDA context and two frameworks' thread pools never
share a process; gpubench.calibrate.cache keeps, per precision, the best kernel's figure.

A peak is only a ceiling if training cannot beat it, so the kernels are the ones training runs,
called the way the trainers call them (docs/calibration.md).

Each kernel runs a few sizes, smallest first, with random data (normal, never zeros: zeros draw
less power and compress in memory, which would overstate the peaks). A size: one untimed call
(lazy initialisation, autotuning), calls in doubling batches to estimate how many fill a block
(none when the first call already took a block), then ``blocks`` timed blocks of back-to-back
calls lasting about ``block_s`` each (CUDA events on a GPU under PyTorch, ``perf_counter`` with
a synchronising read otherwise). A size's figure is its median block (a sustained rate, not one
lucky block); a kernel's is its best size's. A larger size is started only while the time it is
predicted to take (from the last size's, scaled by FLOPs) fits in what is left of
``kernel_budget_s``, so a slow kernel (bf16 emulated on a CPU without native support takes
seconds per call) stays bounded. """

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}
LOW_PRECISIONS = ("fp16", "bf16")  # autocast (PyTorch) / mixed policy (Keras) precisions


@dataclass(frozen=True)
class ConvShape:
    """A square-kernel, stride-1, same-padding convolution; ``size`` is the batch."""

    channels_in: int
    channels_out: int
    hw: int  # input (and output) height = width
    kernel: int

    def flops(self, batch: int) -> int:
        return 2 * batch * self.channels_out * self.channels_in * self.kernel**2 * self.hw**2

    def describe(self, batch: int) -> str:
        return (f"N={batch} {self.channels_in}->{self.channels_out} {self.hw}x{self.hw} "
                f"k{self.kernel} NHWC")


@dataclass(frozen=True)
class Plan:
    precisions: tuple[str, ...]
    matmul_sizes: tuple[int, ...]  # n of the n x n x n products (mm, linear, matmul), smallest first
    conv: ConvShape
    conv_batches: tuple[int, ...]  # smallest first
    block_s: float  # target duration of one timed block
    blocks: int
    kernel_budget_s: float  # per kernel and precision: no larger size once it would overrun this
    copy_bytes: int  # size of the copied buffer (the copy moves twice this: read + write)
    warmup_s: float


# CPU: a few seconds per framework (CI runs it; so does the first gpubench run); conv as in the
# CIFAR ResNet-18's first stage. GPU: matmul sizes up to 16384, where an H100 reaches its bf16
# peak, conv as in ResNet-50's third stage, and a 1 GiB
# copy (hundreds of microseconds on HBM, far beyond the L2 cache).
PLANS = {
    "cpu": Plan(("fp32", "bf16"), (256, 512, 1024, 2048),
                ConvShape(64, 64, 32, 3), (1, 4, 16, 64), block_s=0.05, blocks=3, kernel_budget_s=1.0,
                copy_bytes=256 << 20, warmup_s=0.0),
    "cuda": Plan(PRECISIONS, (2048, 4096, 8192, 16384),
                 ConvShape(256, 256, 14, 3), (64, 128, 256, 512), block_s=0.1, blocks=5, kernel_budget_s=20.0,
                 copy_bytes=1 << 30, warmup_s=1.0),
}

Call = Callable[[], object]  # a kernel call; what it returns is not used


@dataclass
class Kernel:
    """One framework operation at one precision, over a list of sizes. ``prepare(size)``
    allocates the inputs and returns the call to time and a ``sync`` that waits for the calls
    made so far (None where the clock itself waits, e.g. CUDA events or a synchronous CPU)."""

    framework: str
    op: str
    precision: str
    sizes: tuple[int, ...]
    flops: Callable[[int], float]
    shape: Callable[[int], str]
    prepare: Callable[[int], tuple[Call, Call | None]]
    errors: tuple[type[BaseException], ...] = (RuntimeError, MemoryError)


class HostClock:
    """Seconds taken by ``n`` back-to-back calls, on ``perf_counter``, synchronised at the end."""

    def time(self, fn: Call, n: int, sync: Call | None = None) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if sync is not None:
            sync()
        return time.perf_counter() - t0


def calls_per_block(clock: HostClock, fn: Call, plan: Plan, sync: Call | None, first_s: float) -> int:
    """How many calls fill a block: a first call longer than a block is its own estimate (a slow
    kernel's every call counts); otherwise batches of doubling size until one lasts a quarter
    of a block, so that one call slowed by a neighbour's load does not make every block short."""
    if first_s >= plan.block_s:
        return 1
    n, took = 1, clock.time(fn, 1, sync)
    while took < plan.block_s / 4 and n < 1 << 20:
        n *= 2
        took = clock.time(fn, n, sync)
    return max(1, round(plan.block_s * n / max(took, 1e-9)))


def sustained(clock: HostClock, fn: Call, plan: Plan, sync: Call | None = None) -> tuple[list[float], int]:
    """(seconds per call in each timed block, calls per block)."""
    first = clock.time(fn, 1, sync)  # lazy initialisation, autotuning: not a figure
    calls = calls_per_block(clock, fn, plan, sync, first)
    return [clock.time(fn, calls, sync) / calls for _ in range(plan.blocks)], calls


def predicted_s(seconds_per_call: float, plan: Plan) -> float:
    """Time a size is expected to take, given its seconds per call (see ``sustained``): the
    untimed call, the estimate (at most about half a block), the blocks."""
    if seconds_per_call >= plan.block_s:
        return (1 + plan.blocks) * seconds_per_call
    calls = max(1, round(plan.block_s / seconds_per_call))
    return 2 * seconds_per_call + plan.block_s / 2 + plan.blocks * calls * seconds_per_call


def _error_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def run_kernel(kernel: Kernel, plan: Plan, clock: HostClock) -> dict[str, Any]:
    """The kernel's best sustained TFLOP/s over its sizes (None when no size ran), with every
    size's figures and a note on the sizes it skipped (past ``kernel_budget_s`` of timing; the
    time to prepare a size does not count)."""
    sizes: list[dict[str, Any]] = []
    note = ""
    t0 = time.perf_counter()
    preparing = 0.0  # allocation, and a compiling framework's compilation (JAX): not held against the budget
    for size in kernel.sizes:
        if sizes:
            last = sizes[-1]
            expected = predicted_s(last["seconds_per_call"] * kernel.flops(size) / kernel.flops(last["size"]), plan)
            left = plan.kernel_budget_s - (time.perf_counter() - t0 - preparing)
            if expected > left:
                note = (f"sizes from {size} skipped: about {expected:.2g} s expected, {max(left, 0):.2g} s left of "
                        f"the {plan.kernel_budget_s:g} s budget")
                break
        prepared: tuple[Call, Call | None] | None = None
        try:
            started = time.perf_counter()
            prepared = kernel.prepare(size)
            preparing += time.perf_counter() - started
            per_call, calls = sustained(clock, prepared[0], plan, prepared[1])
        except kernel.errors as e:  # out of memory at a large size, no kernel for this dtype: keep what ran
            note = f"size {size}: {_error_line(e)}"
            break
        finally:
            prepared = None  # free the inputs before the next size allocates
        tflops = [kernel.flops(size) / s / 1e12 for s in per_call]
        sizes.append({"size": size, "shape": kernel.shape(size), "tflops": statistics.median(tflops),
                      "blocks_tflops": tflops, "calls_per_block": calls,
                      "seconds_per_call": statistics.median(per_call)})
    best = max(sizes, key=lambda s: s["tflops"], default=None)
    return {"framework": kernel.framework, "op": kernel.op, "precision": kernel.precision,
            "tflops": best["tflops"] if best else None, "size": best["size"] if best else None,
            "shape": best["shape"] if best else None, "sizes": sizes, "note": note,
            "seconds": time.perf_counter() - t0}


def capability_gaps(major: int, minor: int, bf16: bool) -> dict[str, str]:
    """The precisions a GPU of this compute capability lacks, with the reason."""
    out = {}
    if major < 8:
        out["tf32"] = f"tf32 needs compute capability 8.0 or newer; this GPU is sm_{major}{minor}"
    if not bf16:
        out["bf16"] = f"this GPU (sm_{major}{minor}) has no bfloat16 support"
    return out


def available_devices(n_cuda: int) -> str:
    """``cpu``, ``cpu, cuda:0`` or ``cpu, cuda:0..3``: what ``--device`` can name here."""
    return "cpu" + ("" if n_cuda == 0 else ", cuda:0" if n_cuda == 1 else f", cuda:0..{n_cuda - 1}")


def child_main(measure: Callable[[str], dict[str, Any]], framework: str, argv: list[str]) -> int:
    """A framework's calibration child (``python -m <its backend's calibration module> DEVICE``):
    its figures for ``argv[0]``, one JSON object on stdout, ``unavailable`` where the framework
    cannot be imported."""
    device = argv[0]
    try:
        result = measure(device)
    except ImportError as e:
        result = {"device": device, "unavailable": f"{framework} is not installed ({e})"}
    print(json.dumps(result))
    return 0
