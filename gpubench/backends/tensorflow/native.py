"""A config's model as a ``keras.Model``, whatever its source: a built-in spec, the user's
factory (``module:function``), or keras.applications by name (``keras:ResNet50``).

A user's model takes its data in its own layout (channels last, as Keras builds images), so
``input_shape`` is one sample's shape as the model takes it. Mixed precision is Keras' own:
the dtype policy is set globally while the factory builds the model, so its layers compute in
float16 or bfloat16 with float32 variables; the loss is computed in float32.

For a model that is not a built-in, the model is built once here, before the trainer: its
output tells the classes of the synthetic task where the suite gives none, and
gpubench.backends.tensorflow.flops counts one training step's FLOPs at batch 2.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from gpubench.backends.base import NativeModel, Tree, spec_native
from gpubench.config import Config
from gpubench.workloads import WORKLOADS
from gpubench.workloads.base import WorkloadSpec
from gpubench.workloads.data import SyntheticTask
from gpubench.workloads.dataset import builtin_spec
from gpubench.workloads.source import (
    CHOICES,
    FIRST_BATCH,
    ModelRef,
    SourceError,
    check_arguments,
    check_first_batch,
    code_origin,
    config_loss,
    counted_once,
    import_function,
    input_problem,
    nearest,
    own_batches,
    parse_workload,
    probe_scores,
    token_task,
)

POLICIES = {"amp-fp16": "mixed_float16", "amp-bf16": "mixed_bfloat16"}
FLOP_COUNT_BATCH = FIRST_BATCH  # the first batch's samples (own_batches), counted and checked
DEFAULT_IMAGE = (224, 224, 3)
Loss = Callable[[Any, Any], Any]  # a loss function: gpubench's (outputs, targets), or Keras' (targets, outputs)


def builtin_loss() -> Loss:
    """Sparse cross-entropy from the logits, in float32 (Keras' argument order: targets first)."""
    sparse = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def loss(y: tf.Tensor, out: tf.Tensor) -> tf.Tensor:
        return sparse(y, tf.cast(out, tf.float32))
    return loss


def as_native(model: NativeModel | WorkloadSpec, config: Config) -> NativeModel:
    """A built-in spec handed over directly (tests, the overhead benchmark) as its NativeModel."""
    return _builtin(model, config) if isinstance(model, WorkloadSpec) else model


def _builtin(spec: WorkloadSpec, config: Config) -> NativeModel:
    from gpubench.backends.tensorflow.model import build_model

    policy = POLICIES.get(config.precision)
    seed = config.init_seed
    return spec_native(spec, config, lambda: build_model(spec, spec.init_weights(seed), policy, seed),
                       channels_first_data=True)


def native_model(config: Config, counts: Path | None = None, count: bool = True) -> NativeModel:
    """The config's model, its data and its facts; ``counts``: the run's FLOP counts (counted_once;
    none with ``count`` False)."""
    ref = parse_workload(config.workload, sorted(WORKLOADS))
    if ref.kind == "builtin":
        return _builtin(builtin_spec(config), config)
    make, facts = _source(ref, config)
    user_loss = config_loss(config)
    batch_fn = import_function(config.batches, "batches") if config.batches else None
    probe = _built(make, None, config.seed)
    if not isinstance(probe, keras.Model):
        raise SourceError(f"workload {config.workload!r}: the factory returned {type(probe).__name__}, not a "
                          "keras.Model (framework = tensorflow)")
    notes: list[str] = []
    task = None
    if batch_fn is None and config.dataset == "synthetic":
        task = _task(probe, config, notes, ref.kind == "factory")
        facts.update(input_shape=list(task.input_shape), num_classes=task.num_classes, task=task.kind)
    data: dict[str, Any] = {}
    make_batches, sample, held_out = own_batches(task, batch_fn, config, facts, data)
    x, y = sample.sample(FLOP_COUNT_BATCH)
    keras_loss = _keras_order(user_loss) if user_loss is not None else None
    _check_first_batch(probe, x, y, keras_loss, config, task)  # (a model that declares no input is built by it)
    if notes:
        facts["notes"] = notes
    # trainable parameters, as PyTorch and the specs count them (not batch norm's moving statistics)
    facts["params"] = int(sum(np.prod(v.shape) for v in probe.trainable_variables))
    if count:
        facts.update(counted_once(counts, config, facts, tf.__version__,
                                  partial(_train_flops, probe, x, y, keras_loss or builtin_loss())))
    del probe
    keras.backend.clear_session()
    policy = POLICIES.get(config.precision)
    return NativeModel(build=lambda: _built(make, policy, config.init_seed), make_batches=make_batches, facts=facts,
                       loss=keras_loss, eval_batches=held_out, data=data)


def _check_first_batch(model: keras.Model, x: Tree[np.ndarray], y: Tree[np.ndarray], keras_loss: Loss | None,
                       config: Config, task: SyntheticTask | None) -> None:
    """The model on a batch of 2 of what it trains on, before any config trains: it takes the
    inputs, and its loss (Keras' sparse cross-entropy, the user's, the model's own) is one finite
    number (``check_first_batch``)."""
    loss = keras_loss or builtin_loss()
    check_first_batch(config, task, lambda: model(x, training=False), _scores_of, lambda out: loss(y, out),
                      keras_loss is not None, tuple(y.shape) if isinstance(y, np.ndarray) else None)


def _train_flops(model: keras.Model, x: Tree[np.ndarray], y: np.ndarray, loss: Loss) -> dict[str, Any]:
    from gpubench.backends.tensorflow.flops import keras_train_flops

    flops, how = keras_train_flops(model, x, y, loss)
    return {"flops_per_sample": flops, "flops_counted_by" if flops is not None else "flops_note": how}


def _keras_order(fn: Loss) -> Loss:
    """A user's ``loss(outputs, targets)`` (gpubench's order in every framework) as Keras'
    ``loss(targets, outputs)``."""
    def loss(y: Tree[tf.Tensor], out: object) -> tf.Tensor:
        return fn(out, y)
    return loss


def _built(make: Callable[[], object], policy: str | None, seed: int) -> object:
    """The model, built with the dtype policy set globally (then put back) and Keras seeded:
    every build gives the same weights."""
    keras.utils.set_random_seed(seed)
    before = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy(policy or "float32")
    try:
        return make()
    finally:
        keras.mixed_precision.set_dtype_policy(before)


def _source(ref: ModelRef, config: Config) -> tuple[Callable[[], object], dict[str, Any]]:
    kwargs = dict(config.workload_params)
    if ref.kind == "factory":
        fn = import_function(config.workload, "workload")
        check_arguments(fn, kwargs, config.workload)
        return (lambda: fn(**kwargs)), {"source": "factory", "identical": False, "origin": code_origin(fn)}
    if ref.module != "keras":
        raise SourceError(f"workload {config.workload!r}: {ref.module} models train with another framework")
    names = [n for n in dir(keras.applications) if n[:1].isupper() and callable(getattr(keras.applications, n))]
    if ref.name not in names:
        raise SourceError(f"workload {ref.text!r}: keras.applications has no model {ref.name!r}"
                          f"{nearest(ref.name, names)}")
    app = getattr(keras.applications, ref.name)
    kw = {"weights": None, "input_shape": tuple(config.input_shape or DEFAULT_IMAGE),
          "classes": config.num_classes or 1000, "classifier_activation": None, **kwargs}
    return (lambda: app(**kw)), {"source": "keras", "identical": False, "model_name": ref.name,
                                 "version": keras.__version__}


def _task(model: keras.Model, config: Config, notes: list[str], factory: bool) -> SyntheticTask:
    """The synthetic task: one sample's shape (the suite's, else the model's declared input); a
    factory's token task (``token_task``: an embedding as its first layer); else the classes (the
    suite's, else the model's last output dimension, from a forward pass on zeros)."""
    shape = tuple(config.input_shape)
    if not shape:
        declared = getattr(model, "input_shape", None) if model.built else None
        if not isinstance(declared, tuple) or any(d is None for d in declared[1:]):
            raise SourceError(f"workload {config.workload!r}: the model declares no fixed input shape; set "
                              "input_shape (one sample, channels last, e.g. [32, 32, 3])")
        shape = tuple(int(d) for d in declared[1:])
    if factory:
        first = next((layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)), None)
        vocab = int(first.input_dim) if isinstance(first, keras.layers.Embedding) else None
        name = f"{type(first).__name__}({vocab}, {first.output_dim})" if vocab and first is not None else ""
        scores = None
        if len(shape) == 1 and config.input_kind != "features" and (vocab or config.input_kind == "tokens"):
            found = probe_scores(config, np.zeros((FLOP_COUNT_BATCH, *shape), np.int32), True,
                                 lambda inputs: model(inputs, training=False), _scores_of)
            scores = None if isinstance(found, BaseException) else found  # (none: not a token model)
        tokens = token_task(config, shape, vocab, name, scores, notes)
        if tokens is not None:
            return tokens
    task = SyntheticTask(shape, config.num_classes)
    if config.num_classes:
        return task
    found = probe_scores(config, np.zeros((FLOP_COUNT_BATCH, *shape), np.float32), False,
                         lambda inputs: model(inputs, training=False), _scores_of)
    if isinstance(found, BaseException):  # the model rejects the input: say which shape
        raise input_problem(config, task, found) from None
    if found is None:
        raise SourceError(f"workload {config.workload!r}: the model gives no scores (one array) on input_shape "
                          f"{list(shape)}; set num_classes, or use {CHOICES}")
    return SyntheticTask(shape, int(found[-1]))


def _scores_of(out: object) -> tuple[int, ...] | None:
    """The shape of a Keras model's output, its scores (None: not one array)."""
    shape = getattr(out, "shape", None)
    return tuple(int(d) for d in shape) if shape is not None else None


__all__ = ["POLICIES", "as_native", "builtin_loss", "native_model"]
