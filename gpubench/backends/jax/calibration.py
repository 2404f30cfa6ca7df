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
from types import ModuleType
from typing import Any

from gpubench.measure.kernels import (
    DTYPES,
    PLANS,
    HostClock,
    Kernel,
    Plan,
    capability_gaps,
    child_main,
    run_kernel,
)
from gpubench.options import device_index, device_kind

OPS = ("matmul", "conv2d")


def jax_kernels(jax: ModuleType, device: Any, plan: Plan, precisions: list[str]) -> list[Kernel]:
    """The plan's JAX kernels at each precision, their inputs on ``device``."""
    import jax.numpy as jnp
    from jax import lax

    errors = (RuntimeError, MemoryError, ValueError)

    def precision_of(p: str) -> Any:
        return lax.Precision.HIGHEST if p == "fp32" else lax.Precision.DEFAULT

    def synced(fn: Any, *args: Any) -> tuple[Any, Any]:
        last: list[Any] = [None]

        def call() -> None:
            last[0] = fn(*args)

        def sync() -> None:  # waits for every call queued before it (one stream per device)
            if last[0] is not None:
                last[0].block_until_ready()
        call()  # compiled here, untimed
        sync()
        return call, sync

    def normal(shape: tuple[int, ...], dtype: Any, seed: int) -> Any:
        return jax.device_put(jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype), device)

    def matmul(p: str) -> Any:
        dtype, prec = getattr(jnp, DTYPES[p]), precision_of(p)

        def prepare(n: int) -> tuple[Any, Any]:
            x, w = normal((n, n), dtype, 0), normal((n, n), jnp.float32, 1)  # w: a float32 parameter
            return synced(jax.jit(lambda x, w: jnp.matmul(x, w.astype(dtype), precision=prec)), x, w)
        return prepare

    def conv2d(p: str) -> Any:
        dtype, prec, s = getattr(jnp, DTYPES[p]), precision_of(p), plan.conv

        def prepare(batch: int) -> tuple[Any, Any]:
            x = normal((batch, s.channels_in, s.hw, s.hw), dtype, 0)
            w = normal((s.channels_out, s.channels_in, s.kernel, s.kernel), jnp.float32, 1)
            pad = s.kernel // 2
            return synced(jax.jit(lambda x, w: lax.conv_general_dilated(
                x, w.astype(dtype), (1, 1), [(pad, pad), (pad, pad)], dimension_numbers=("NCHW", "OIHW", "NCHW"),
                precision=prec)), x, w)
        return prepare

    def conv_shape(batch: int) -> str:  # the plan's label says NHWC (PyTorch's channels-last); this one is NCHW
        return plan.conv.describe(batch).replace("NHWC", "NCHW")

    makers = {"matmul": (matmul, lambda n: 2.0 * n**3, lambda n: f"{n}x{n}x{n}", plan.matmul_sizes),
              "conv2d": (conv2d, plan.conv.flops, conv_shape, plan.conv_batches)}
    out = []
    for precision in precisions:
        for op in OPS:
            make, flops, shape, sizes = makers[op]
            out.append(Kernel("jax", op, precision, sizes, flops, shape, make(precision), errors))
    return out


def measure(device: str) -> dict[str, Any]:
    """JAX's figures for one device, or ``unavailable`` with the reason."""
    import os

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # as the trainer's (backends/jax)
    import jax

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


def main(argv: list[str]) -> int:
    return child_main(measure, "jax", argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
