"""TensorFlow profiling pieces: the step as separate tf.functions for the breakdown pass, and
the tf.profiler pass (its trace directory, a Chrome trace and operator table from it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from gpubench.backends.base import Lap
from gpubench.backends.tensorflow.xplane import chrome_trace, op_rows, read_xspace

if TYPE_CHECKING:
    from gpubench.backends.tensorflow.trainer import TFTrainer

STEP_TRACE = "gpubench step"


class PhaseFunctions:
    """The training step cut into tf.functions called one by one: the batch (device-resident
    pool), forward + loss, forward + loss + gradients, the optimizer's update. TensorFlow
    computes gradients only inside the tape's function, so backward is timed together with
    a forward and the breakdown subtracts the forward-only call (``forward_backward``).
    With compile = xla each function is XLA-compiled on its own, which fuses less than the
    single step function does."""

    def __init__(self, trainer: TFTrainer) -> None:
        t = self.t = trainer
        n = t.accum
        self.forward = self._function(lambda x, y: t._forward_loss(x, y, n))
        self.gradients = self._function(lambda x, y: t._gradients(x, y, n))
        self.apply = self._function(t._apply)
        self.batch = None if t.pipeline else self._function(t._next_device_batch)

    def _function(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        device = self.t.device

        def placed(*args: Any) -> Any:
            with tf.device(device):
                return fn(*args)
        return tf.function(placed, jit_compile=self.t.xla)

    def step(self, lap: Lap) -> tf.Tensor:
        t = self.t
        if t.pipeline:  # one element holds every micro-batch of the step
            x, y = next(t._iter)
            micro = [(x, y)] if t.accum == 1 else [(x[k], y[k]) for k in range(t.accum)]
            lap("data")
        total = grads = None
        for k in range(t.accum):
            if self.batch is not None:
                xb, yb = self.batch()
                lap("data")
            else:
                xb, yb = micro[k]
            self.forward(xb, yb)
            lap("forward")
            loss, part = self.gradients(xb, yb)
            lap("forward_backward")
            grads = part if grads is None else [a + b for a, b in zip(grads, part)]
            total = loss if total is None else total + loss
        self.apply(grads)
        lap("optimizer")
        return total


def profile_steps(trainer: TFTrainer, steps: int, out_dir: Path) -> dict[str, Any]:
    """``steps`` steps under tf.profiler.experimental (host tracer level 2, and the GPU
    tracer on a GPU), each in a ``gpubench step`` trace range. The profiler's own directory
    (``tf/plugins/profile/<time>/<host>.xplane.pb``, for TensorBoard's profile plugin) is
    kept; the Chrome trace and the operator table are read from it."""
    logdir = out_dir / "tf"
    options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0,
                                                       device_tracer_level=1)
    trainer.sync()
    tf.profiler.experimental.start(str(logdir), options=options)
    try:
        for i in range(steps):
            with tf.profiler.experimental.Trace(STEP_TRACE, step_num=i, _r=1):
                trainer.step()
        trainer.sync()
    finally:
        tf.profiler.experimental.stop()
    found = sorted(logdir.glob("plugins/profile/*/*.xplane.pb"))
    if not found:
        raise RuntimeError(f"the TensorFlow profiler wrote no .xplane.pb file under {logdir}")
    space = read_xspace(found[-1])
    trace = out_dir / "trace.json"
    chrome_trace(space, trace)
    return {"profiler": "tf.profiler.experimental (host tracer level 2" + (", GPU tracer)" if trainer.gpu else ")"),
            "trace": trace, "logdir": logdir, "ops": op_rows(space), "steps": steps}
