"""The JAX calibration child: ``python -m gpubench.backends.jax.calibration DEVICE`` times JAX's
training kernels (a matrix product and a convolution, each one ``jax.jit`` program) on one
device with the method and plan of gpubench.measure.kernels, and prints one JSON object. A
process of its own, as for TensorFlow: one framework's thread pools per process.

The calls are the JAX trainer's: inputs in the compute dtype, float32 weights cast to it inside
the program, fp32 at ``Precision.HIGHEST`` (true float32), tf32 at ``DEFAULT`` (the GPU may use
TF32), the convolution in gpubench's NCHW/OIHW layout.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gpubench.measure.kernels import (
    DTYPES,
    PLANS,
    Call,
    HostClock,
    Kernel,
    Plan,
    capability_gaps,
    child_main,
    run_kernel,
)
from gpubench.options import device_index, device_kind

if TYPE_CHECKING:
    from jax import Array, Device
    from jax.typing import DTypeLike

OPS = ("matmul", "conv2d")


def jax_kernels(jax: ModuleType, device: Device, plan: Plan, precisions: list[str]) -> list[Kernel]:
    """The plan's JAX kernels at each precision, their inputs on ``device``."""
    import jax.numpy as jnp
    from jax import lax

    errors = (RuntimeError, MemoryError, ValueError)

    def precision_of(p: str) -> lax.Precision:
        return lax.Precision.HIGHEST if p == "fp32" else lax.Precision.DEFAULT

    def synced(fn: Callable[..., Array], *args: Array) -> tuple[Call, Call]:
        last: list[Array | None] = [None]

        def call() -> None:
            last[0] = fn(*args)

        def sync() -> None:  # waits for every call queued before it (one stream per device)
            if (out := last[0]) is not None:
                out.block_until_ready()
        call()  # compiled here, untimed
        sync()
        return call, sync

    def normal(shape: tuple[int, ...], dtype: DTypeLike, seed: int) -> Array:
        return jax.device_put(jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype), device)

    def matmul(p: str) -> Callable[[int], tuple[Call, Call]]:
        dtype, prec = getattr(jnp, DTYPES[p]), precision_of(p)

        def prepare(n: int) -> tuple[Call, Call]:
            x, w = normal((n, n), dtype, 0), normal((n, n), jnp.float32, 1)  # w: a float32 parameter
            return synced(jax.jit(lambda x, w: jnp.matmul(x, w.astype(dtype), precision=prec)), x, w)
        return prepare

    def conv2d(p: str) -> Callable[[int], tuple[Call, Call]]:
        dtype, prec, s = getattr(jnp, DTYPES[p]), precision_of(p), plan.conv

        def prepare(batch: int) -> tuple[Call, Call]:
            x = normal((batch, s.channels_in, s.hw, s.hw), dtype, 0)
            w = normal((s.channels_out, s.channels_in, s.kernel, s.kernel), jnp.float32, 1)
            pad = s.kernel // 2
            return synced(jax.jit(lambda x, w: lax.conv_general_dilated(
                x, w.astype(dtype), (1, 1), [(pad, pad), (pad, pad)], dimension_numbers=("NCHW", "OIHW", "NCHW"),
                precision=prec)), x, w)
        return prepare

    # the plan's convolution label says NHWC (PyTorch's channels-last); this one is NCHW
    makers = {"matmul": (matmul, lambda n: 2.0 * n**3, lambda n: f"{n}x{n}x{n}", plan.matmul_sizes),
              "conv2d": (conv2d, plan.conv.flops, lambda b: plan.conv.describe(b).replace("NHWC", "NCHW"),
                         plan.conv_batches)}
    return [Kernel("jax", op, precision, sizes, flops, shape, make(precision), errors)
            for precision in precisions for op in OPS for make, flops, shape, sizes in [makers[op]]]


def measure(device: str) -> dict[str, Any]:
    """JAX's figures for one device, or ``unavailable`` with the reason."""
    from gpubench.backends.jax.backend import import_jax

    jax = import_jax()
    kind = device_kind(device)
    plan = PLANS[kind]
    info: dict[str, Any] = {"device": device, "framework": {"name": "jax", "version": jax.__version__}}
    skipped: dict[str, str] = {}
    if kind == "cuda":
        try:
            gpus = jax.devices("gpu")
        except RuntimeError:
            gpus = []
        if device_index(device) >= len(gpus):
            return {**info, "unavailable": f"JAX {jax.__version__} sees {len(gpus)} GPU(s), so no {device}"}
        target = gpus[device_index(device)]
        major, minor = (int(v) for v in str(getattr(target, "compute_capability", "0.0")).split(".")[:2])
        skipped = capability_gaps(major, minor, major >= 8)
    else:
        target = jax.devices("cpu")[0]
    precisions = [p for p in plan.precisions if p not in skipped]
    clock = HostClock()
    t0 = time.perf_counter()
    if plan.warmup_s > 0:  # this process starts after the PyTorch one: ramp the clocks up again
        n = plan.matmul_sizes[len(plan.matmul_sizes) // 2]
        a = jax.device_put(jax.numpy.ones((n, n)), target)
        square = jax.jit(lambda a: a @ a)
        end = time.perf_counter() + plan.warmup_s
        while time.perf_counter() < end:
            square(a).block_until_ready()
        del a
    kernels = [run_kernel(k, plan, clock) for k in jax_kernels(jax, target, plan, precisions)]
    return {**info, "kernels": kernels, "skipped": skipped, "seconds": time.perf_counter() - t0}


if __name__ == "__main__":
    sys.exit(child_main(measure, "jax", sys.argv[1:]))
