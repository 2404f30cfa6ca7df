"""Translate a framework-neutral WorkloadSpec into a Keras 3 functional model (channels last)."""

from __future__ import annotations

import keras
import numpy as np

from gpubench.backends.tensorflow.layout import keras_weights, nhwc_shape
from gpubench.workloads.base import (
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    GlobalAvgPool,
    Layer,
    Linear,
    MaxPool2d,
    ReLU,
    Residual,
    WorkloadSpec,
)


class NegInfPadding2D(keras.layers.Layer):
    """Pads H and W with -inf on every side: padded positions never win a max pool, as in
    PyTorch's MaxPool2d (ZeroPadding2D would let a 0 win over negative inputs)."""

    def __init__(self, padding: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.padding = padding

    def call(self, x):
        p = self.padding
        return keras.ops.pad(x, [[0, 0], [p, p], [p, p], [0, 0]], constant_values=float("-inf"))

    def compute_output_shape(self, shape):
        p = 2 * self.padding
        return (shape[0], None if shape[1] is None else shape[1] + p, None if shape[2] is None else shape[2] + p,
                shape[3])

    def get_config(self) -> dict:
        return {**super().get_config(), "padding": self.padding}


class _Builder:
    """Applies spec layers to Keras tensors, keeping each leaf's parametric Keras layer (in
    ``spec.leaves()`` order) to load the canonical weights into."""

    def __init__(self, policy: str | None, seed: int) -> None:
        self.kw = {"dtype": policy} if policy else {}
        self.seed = seed
        self.leaf_layers: list[keras.layers.Layer | None] = []

    def chain(self, layers: tuple[Layer, ...], x):
        for layer in layers:
            x = self.apply(layer, x)
        return x

    def apply(self, layer: Layer, x):
        kw, kl = self.kw, keras.layers
        if isinstance(layer, Residual):
            main = self.chain(layer.main, x)
            shortcut = self.chain(layer.shortcut, x)
            return kl.ReLU(**kw)(kl.Add(**kw)([main, shortcut]))
        index = len(self.leaf_layers)  # the leaf's position, for its dropout seed
        if isinstance(layer, Conv2d):
            # Keras' "same" pads (k - 1) / 2 on each side at stride 1, as PyTorch does with that
            # padding: one op. Otherwise (strided: "same" pads the bottom/right first) an explicit
            # symmetric ZeroPadding2D before a "valid" convolution
            same = layer.stride == 1 and 2 * layer.padding == layer.kernel_size - 1
            if layer.padding and not same:
                x = kl.ZeroPadding2D(layer.padding, **kw)(x)
            out = kl.Conv2D(layer.out_channels, layer.kernel_size, strides=layer.stride,
                            padding="same" if same else "valid", use_bias=layer.bias, **kw)
        elif isinstance(layer, Linear):
            out = kl.Dense(layer.out_features, **kw)
        elif isinstance(layer, BatchNorm2d):  # Keras' momentum weighs the old value: 1 - PyTorch's
            out = kl.BatchNormalization(axis=-1, epsilon=layer.eps, momentum=1.0 - layer.momentum, **kw)
        elif isinstance(layer, ReLU):
            out = kl.ReLU(**kw)
        elif isinstance(layer, MaxPool2d):
            if layer.padding:
                x = NegInfPadding2D(layer.padding, **kw)(x)
            out = kl.MaxPooling2D(layer.kernel_size, strides=layer.step, **kw)
        elif isinstance(layer, GlobalAvgPool):
            out = kl.GlobalAveragePooling2D(**kw)
        elif isinstance(layer, Dropout):
            out = kl.Dropout(layer.p, seed=self.seed * 1000 + index, **kw)
        elif isinstance(layer, Flatten):
            out = kl.Flatten(**kw)
        else:
            raise TypeError(f"the tensorflow backend cannot translate layer {layer!r}")
        self.leaf_layers.append(out)
        return out(x)


def build_model(spec: WorkloadSpec, weights: list[list[np.ndarray]] | None = None, policy: str | None = None,
                seed: int = 0) -> keras.Model:
    """The spec as a Keras functional model. ``policy`` is a mixed-precision dtype policy name
    (``mixed_float16``, ``mixed_bfloat16``); with one, the logits are cast back to float32 so
    the loss is computed in float32, as PyTorch's autocast does for cross-entropy."""
    builder = _Builder(policy, seed)
    inputs = keras.Input(shape=nhwc_shape(spec.input_shape))
    x = builder.chain(spec.layers, inputs)
    if policy:
        x = keras.layers.Activation("linear", dtype="float32")(x)
    model = keras.Model(inputs, x, name=spec.name)
    if weights is not None:
        for layer, arrays in zip(builder.leaf_layers, keras_weights(spec, weights), strict=True):
            if arrays:
                assert layer is not None  # a leaf with weights was built as a Keras layer
                layer.set_weights(arrays)
    return model
