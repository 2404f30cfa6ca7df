"""Translate a framework-neutral WorkloadSpec into a Keras 3 model (channels last)."""

from __future__ import annotations

import numpy as np

import keras

from gpubench.backends.tensorflow.layout import keras_weights, nhwc_shape
from gpubench.workloads.base import Conv2d, Dropout, Flatten, Layer, Linear, MaxPool2d, ReLU, WorkloadSpec


def _layer(layer: Layer, index: int, policy: str | None, seed: int) -> list[keras.layers.Layer]:
    kw = {"dtype": policy} if policy else {}
    if isinstance(layer, Conv2d):
        out = [keras.layers.ZeroPadding2D(layer.padding, **kw)] if layer.padding else []
        return out + [keras.layers.Conv2D(layer.out_channels, layer.kernel_size, strides=layer.stride,
                                          padding="valid", **kw)]
    if isinstance(layer, Linear):
        return [keras.layers.Dense(layer.out_features, **kw)]
    if isinstance(layer, ReLU):
        return [keras.layers.ReLU(**kw)]
    if isinstance(layer, MaxPool2d):
        return [keras.layers.MaxPooling2D(layer.kernel_size, **kw)]
    if isinstance(layer, Dropout):
        return [keras.layers.Dropout(layer.p, seed=seed * 1000 + index, **kw)]
    if isinstance(layer, Flatten):
        return [keras.layers.Flatten(**kw)]
    raise TypeError(f"the tensorflow backend cannot translate layer {layer!r}")


def build_model(spec: WorkloadSpec, weights: list[list[np.ndarray]] | None = None, policy: str | None = None,
                seed: int = 0) -> keras.Sequential:
    """The spec as a Keras Sequential. ``policy`` is a mixed-precision dtype policy name
    (``mixed_float16``, ``mixed_bfloat16``); with one, the logits are cast back to float32 so
    the loss is computed in float32, as PyTorch's autocast does for cross-entropy."""
    per_spec_layer = [_layer(layer, i, policy, seed) for i, layer in enumerate(spec.layers)]
    layers = [keras.Input(shape=nhwc_shape(spec.input_shape))] + [l for ls in per_spec_layer for l in ls]
    if policy:
        layers.append(keras.layers.Activation("linear", dtype="float32"))
    model = keras.Sequential(layers, name=spec.name)
    if weights is not None:
        for keras_layers, arrays in zip(per_spec_layer, keras_weights(spec, weights)):
            if arrays:
                keras_layers[-1].set_weights(arrays)  # the parametric layer comes after any padding
    return model
