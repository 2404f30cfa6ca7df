"""The TensorFlow calibration child: ``python -m gpubench.backends.tensorflow.calibration DEVICE`` times
TensorFlow's training kernels (``tf.linalg.matmul``, ``tf.nn.conv2d``) on one device with the
method and plan of gpubench.measure.kernels, and prints one JSON object. A process of its own:
importing PyTorch and TensorFlow into one process is slow and their thread pools fight.

The calls are Keras' under a mixed-precision policy: inputs in the compute dtype, float32
weights cast to it on every call (its AutoCastVariable). fp32 runs with TF32 off (TensorFlow
turns it on by default on Ampere and newer GPUs), tf32 with it on.
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
    from tensorflow import Tensor

# the operations timed (on every device kind)
OPS = ("matmul", "conv2d")


def tensorflow_kernels(tf: ModuleType, plan: Plan, precisions: list[str]) -> list[Kernel]:
    """The plan's TensorFlow kernels at each precision (run inside ``tf.device``)."""
    errors = (tf.errors.OpError, RuntimeError, MemoryError)

    def synced(make_output: Callable[[], Tensor]) -> tuple[Call, Call]:
        last: list[Tensor | None] = [None]

        def call() -> None:
            last[0] = make_output()

        def sync() -> None:  # one element read back waits for every call queued before it
            tf.reshape(last[0], [-1])[0].numpy()
        return call, sync

    def matmul(precision: str) -> Callable[[int], tuple[Call, Call]]:
        dtype = getattr(tf, DTYPES[precision])

        def prepare(n: int) -> tuple[Call, Call]:
            tf.config.experimental.enable_tensor_float_32_execution(precision == "tf32")
            x = tf.cast(tf.random.normal((n, n)), dtype)
            w = tf.random.normal((n, n))  # float32, as Keras keeps its weights
            return synced(lambda: tf.linalg.matmul(x, tf.cast(w, dtype)))
        return prepare

    def conv2d(precision: str) -> Callable[[int], tuple[Call, Call]]:
        dtype, s = getattr(tf, DTYPES[precision]), plan.conv

        def prepare(batch: int) -> tuple[Call, Call]:
            tf.config.experimental.enable_tensor_float_32_execution(precision == "tf32")
            x = tf.cast(tf.random.normal((batch, s.hw, s.hw, s.channels_in)), dtype)
            w = tf.random.normal((s.kernel, s.kernel, s.channels_in, s.channels_out))
            return synced(lambda: tf.nn.conv2d(x, tf.cast(w, dtype), strides=1, padding="SAME"))
        return prepare

    makers = {"matmul": (matmul, lambda n: 2.0 * n**3, lambda n: f"{n}x{n}x{n}", plan.matmul_sizes),
              "conv2d": (conv2d, plan.conv.flops, plan.conv.describe, plan.conv_batches)}
    return [Kernel("tensorflow", op, precision, sizes, flops, shape, make(precision), errors)
            for precision in precisions for op in OPS for make, flops, shape, sizes in [makers[op]]]


def measure(device: str) -> dict[str, Any]:
    """TensorFlow's figures for one device, or ``unavailable`` with the reason."""
    from gpubench.backends.tensorflow.runtime import import_tf, tf_device

    tf = import_tf()
    kind = device_kind(device)
    plan = PLANS[kind]
    info: dict[str, Any] = {"device": device, "framework": {
        "name": "tensorflow", "version": tf.__version__,
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads()}}
    skipped: dict[str, str] = {}
    if kind == "cuda":
        gpus = tf.config.list_physical_devices("GPU")
        if device_index(device) >= len(gpus):
            return {**info, "unavailable": f"TensorFlow {tf.__version__} sees {len(gpus)} GPU(s), so no {device}"}
        major, minor = tf.config.experimental.get_device_details(gpus[device_index(device)]).get(
            "compute_capability", (0, 0))
        skipped = capability_gaps(major, minor, major >= 8)
    precisions = [p for p in plan.precisions if p not in skipped]
    clock = HostClock()
    t0 = time.perf_counter()
    with tf.device(tf_device(device)):
        if plan.warmup_s > 0:  # this process starts after the PyTorch one: ramp the clocks up again
            n = plan.matmul_sizes[len(plan.matmul_sizes) // 2]
            a = tf.random.normal((n, n))
            end = time.perf_counter() + plan.warmup_s
            while time.perf_counter() < end:
                tf.reshape(tf.linalg.matmul(a, a), [-1])[0].numpy()
            del a
        kernels = [run_kernel(k, plan, clock) for k in tensorflow_kernels(tf, plan, precisions)]
    return {**info, "kernels": kernels, "skipped": skipped, "seconds": time.perf_counter() - t0}


if __name__ == "__main__":
    sys.exit(child_main(measure, "tensorflow", sys.argv[1:]))
