"""TensorFlow profiling pieces: the step as separate tf.functions for the breakdown pass, and
the tf.profiler pass (its trace directory, a Chrome trace and operator table from it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf

from gpubench.backends.base import Lap, Trainer
from gpubench.backends.tensorflow.xplane import chrome_trace, op_rows, read_xspace

STEP_TRACE = "gpubench step"


@dataclass(frozen=True)
class StepParts:
    """What the breakdown pass needs of a trainer's step, as callables (the trainer builds it;
    nothing here reads the trainer's own fields): the forward and loss of one micro-batch (its
    share of the mean over ``accum``), the same with the gradients, the optimizer's update, and
    where the next batch comes from: the device-resident pool (``next_device_batch``) or the
    input pipeline (``next_element``: every micro-batch of one step)."""

    forward_loss: Callable[[Any, Any], Any]
    gradients: Callable[[Any, Any], Any]
    apply: Callable[[Any], Any]
    next_device_batch: Callable[[], Any] | None
    next_element: Callable[[], Any] | None
    accum: int
    device: str
    xla: bool


class PhaseFunctions:
    """The training step cut into tf.functions called one by one: the batch (device-resident
    pool), forward + loss, forward + loss + gradients, the optimizer's update. TensorFlow
    computes gradients only inside the tape's function, so backward is timed together with
    a forward and the breakdown subtracts the forward-only call (``forward_backward``).
    With compile = xla each function is XLA-compiled on its own, which fuses less than the
    single step function does."""

    def __init__(self, parts: StepParts) -> None:
        self.parts = parts
        self.forward = self._function(parts.forward_loss)
        self.gradients = self._function(parts.gradients)
        self.apply = self._function(parts.apply)
        self.batch = None if parts.next_device_batch is None else self._function(parts.next_device_batch)

    def _function(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        device = self.parts.device

        def placed(*args: object) -> object:
            with tf.device(device):
                return fn(*args)
        return tf.function(placed, jit_compile=self.parts.xla)

    def step(self, lap: Lap) -> tf.Tensor:
        parts = self.parts
        if parts.next_element is not None:  # one element holds every micro-batch of the step
            x, y = parts.next_element()
            micro = [(x, y)] if parts.accum == 1 else [(x[k], y[k]) for k in range(parts.accum)]
            lap("data")
        total = grads = None
        for k in range(parts.accum):
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


def profile_steps(trainer: Trainer, steps: int, out_dir: Path, gpu: bool = False) -> dict[str, Any]:
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
    return {"profiler": "tf.profiler.experimental (host tracer level 2" + (", GPU tracer)" if gpu else ")"),
            "trace": trace, "logdir": logdir, "ops": op_rows(space), "steps": steps}
