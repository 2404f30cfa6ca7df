"""The bare TensorFlow side of benchmarks/overhead.py: the workload written out as a Keras
``Sequential`` (channels last) and a plain ``@tf.function`` training step, timed as the wall
time of N steps followed by a device synchronisation.

It does the work gpubench's TF trainer does and nothing else: the same initial weights
(converted from the canonical layout by ``layout.keras_weights``), optimizer, mixed-precision
policy and loss scaling, device-resident batches picked inside the function by a counter
variable, and one ``tf.device`` scope per timed run (not per step).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from gpubench.backends.tensorflow.layout import keras_weights, nhwc_data  # noqa: E402
from gpubench.workloads.base import WorkloadSpec  # noqa: E402
from gpubench.workloads.data import Batches  # noqa: E402

POLICIES = {"amp-fp16": "mixed_float16", "amp-bf16": "mixed_bfloat16"}


def bare_model(workload: str, depth: int, width: int, policy: str | None) -> keras.Sequential:
    """The workload written out by hand (mirrors gpubench/workloads/{mlp,cnn}.py), channels last.
    With a mixed policy the logits are cast to float32, so the loss is computed in float32. The
    dropout seeds are the ones gpubench gives at seed 0 (1000 * seed + layer index), so that the
    two sides' losses can be compared."""
    kw: dict[str, Any] = {"dtype": policy} if policy else {}
    kl = keras.layers
    if workload == "mlp":
        layers = [kl.Flatten(**kw), *(kl.Dense(width, activation="relu", **kw) for _ in range(depth)),
                  kl.Dense(10, **kw)]
    else:  # cnn
        layers = [kl.Conv2D(32, 3, activation="relu", **kw), kl.Conv2D(64, 3, activation="relu", **kw),
                  kl.MaxPooling2D(2, **kw), kl.Dropout(0.25, seed=5, **kw), kl.Flatten(**kw),
                  kl.Dense(128, activation="relu", **kw), kl.Dropout(0.5, seed=9, **kw), kl.Dense(10, **kw)]
    if policy:
        layers.append(kl.Activation("linear", dtype="float32"))
    return keras.Sequential([keras.Input(shape=(28, 28, 1)), *layers])


def tf_device_name(device: str) -> str:
    """cpu -> /CPU:0, cuda[:N] -> /GPU:N."""
    kind, _, index = device.partition(":")
    return "/CPU:0" if kind == "cpu" else f"/GPU:{index or 0}"


class BareLoop:
    """A plain Keras/TensorFlow training loop; ``run(n)`` returns the wall seconds of n steps."""

    def __init__(self, args: argparse.Namespace, spec: WorkloadSpec, weights: list[list[np.ndarray]],
                 batches: Batches) -> None:
        self.device = tf_device_name(args.device)
        self.gpu = self.device.startswith("/GPU")
        policy = POLICIES.get(args.precision)
        scaled = args.precision == "amp-fp16"
        with tf.device(self.device):
            model = bare_model(args.workload, args.depth, args.width, policy)
            parametric = [layer for layer in model.layers if layer.trainable_weights]
            for layer, arrays in zip(parametric, [a for a in keras_weights(spec, weights) if a], strict=True):
                layer.set_weights(arrays)
            opt = keras.optimizers.Adam(learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-8)
            if scaled:
                opt = keras.optimizers.LossScaleOptimizer(opt)
            opt.build(model.trainable_variables)
            loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            xs = tf.constant(nhwc_data(batches.x, batches.x.ndim - 2))
            ys = tf.constant(batches.y)
            counter = tf.Variable(0, dtype=tf.int64, trainable=False)
        n_batches = batches.n_batches
        variables = model.trainable_variables

        @tf.function(jit_compile=args.compile == "xla")
        def train_step() -> tf.Tensor:
            i = counter % n_batches
            counter.assign_add(1)
            x, y = tf.gather(xs, i), tf.gather(ys, i)
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
                target = opt.scale_loss(loss) if scaled else loss
            opt.apply_gradients(zip(tape.gradient(target, variables), variables))
            return loss

        self.model, self.train_step = model, train_step
        self.loss = float("nan")

    def _sync(self, loss: tf.Tensor) -> None:
        if self.gpu:
            tf.test.experimental.sync_devices()
        else:  # CPU ops run synchronously; reading the last loss makes sure
            loss.numpy()

    def run(self, n: int) -> float:
        """One untimed step (as run_loop's cold-start step), then n timed steps."""
        step = self.train_step
        with tf.device(self.device):
            loss = step()
            self._sync(loss)
            t0 = time.perf_counter()
            for _ in range(n):
                loss = step()
            self._sync(loss)
            t1 = time.perf_counter()
        self.loss = float(loss.numpy())
        return t1 - t0


def describe(args: argparse.Namespace) -> tuple[str, str, dict[str, Any]]:
    """(device name, framework text for the header, framework fields for the JSON)."""
    device = tf_device_name(args.device)
    name = "cpu"
    if device.startswith("/GPU"):
        gpu = tf.config.list_physical_devices("GPU")[int(device.rsplit(":", 1)[1])]
        name = tf.config.experimental.get_device_details(gpu).get("device_name", gpu.name)
    intra = tf.config.threading.get_intra_op_parallelism_threads()
    inter = tf.config.threading.get_inter_op_parallelism_threads()
    threads = "/".join(str(t) if t else "auto" for t in (intra, inter))
    xla = args.compile == "xla"
    text = (f"tensorflow {tf.__version__}, keras {keras.__version__}, {threads} intra/inter-op threads"
            f"{', XLA (jit_compile)' if xla else ''}")
    return name, text, {"tensorflow_version": tf.__version__, "keras_version": keras.__version__,
                        "intra_op_threads": intra, "inter_op_threads": inter}
