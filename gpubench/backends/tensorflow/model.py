"""Translate a framework-neutral WorkloadSpec into a Keras 3 functional model (channels last).

gpubench's own layers take only numbers: their configs are Keras 3's, made from their arguments."""

from __future__ import annotations

import keras
import numpy as np

from gpubench.backends.tensorflow.layout import keras_weights, nhwc_shape
from gpubench.workloads.base import (
    BatchNorm2d,
    ClassToken,
    Conv2d,
    Dropout,
    Flatten,
    GlobalAvgPool,
    Layer,
    LayerNorm,
    Linear,
    MaxPool2d,
    PatchEmbed,
    ReLU,
    Residual,
    TiedLMHead,
    TokenEmbedding,
    TransformerBlock,
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


class Patches(keras.layers.Layer):
    """(N, H, W, C) -> (N, 1 + patches, d) (gpubench.workloads.base.PatchEmbed): the weights in
    the canonical layout, the projection a strided convolution with the kernel moved to Keras'
    (kh, kw, in, out) in the graph."""

    def __init__(self, patch: int, d_model: int, tokens: int, channels: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.patch, self.d_model, self.tokens, self.channels = patch, d_model, tokens, channels

    def build(self, shape) -> None:
        d, p = self.d_model, self.patch
        self.kernel = self.add_weight(shape=(d, self.channels, p, p), initializer="zeros", name="kernel")
        self.bias = self.add_weight(shape=(d,), initializer="zeros", name="bias")
        self.cls = self.add_weight(shape=(d,), initializer="zeros", name="cls")
        self.pos = self.add_weight(shape=(self.tokens, d), initializer="zeros", name="pos")

    def call(self, x):
        ops = keras.ops
        y = ops.conv(x, ops.transpose(self.kernel, (2, 3, 1, 0)), strides=self.patch, padding="valid") + self.bias
        y = ops.reshape(y, (-1, self.tokens - 1, self.d_model))  # row-major patches, as the canonical order
        first = ops.broadcast_to(ops.reshape(self.cls, (1, 1, self.d_model)), (ops.shape(y)[0], 1, self.d_model))
        return ops.concatenate([ops.cast(first, y.dtype), y], axis=1) + self.pos

    def compute_output_shape(self, shape):
        return (shape[0], self.tokens, self.d_model)


def _norm(x, scale, shift, eps: float):
    """Layer norm over the last axis, in float32 (as PyTorch's autocast runs it)."""
    ops = keras.ops
    xf = ops.cast(x, "float32")
    mean = ops.mean(xf, axis=-1, keepdims=True)
    var = ops.mean(ops.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * ops.rsqrt(var + eps) * ops.cast(scale, "float32") + ops.cast(shift, "float32")
    return ops.cast(y, x.dtype)


class Block(keras.layers.Layer):
    """A pre-LN transformer block (gpubench.workloads.base.TransformerBlock), its twelve arrays
    in the canonical layout and order; attention as its two matrix products, the softmax in
    float32."""

    def __init__(self, d: int, heads: int, mlp_ratio: int, causal: bool, eps: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.d, self.heads, self.mlp_ratio, self.causal, self.eps = d, heads, mlp_ratio, causal, eps

    def build(self, shape) -> None:
        d, h = self.d, self.mlp_ratio * self.d
        shapes = [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (h, d), (h,), (d, h), (d,)]
        # the layer norms' scale and shift stay float32 under a mixed policy (used in float32, as elsewhere)
        self.arrays = [self.add_weight(shape=s, initializer="zeros", name=f"w{i}", autocast=i not in (0, 1, 6, 7))
                       for i, s in enumerate(shapes)]

    def call(self, x):
        ops = keras.ops
        ln1s, ln1b, wqkv, bqkv, wp, bp, ln2s, ln2b, w1, b1, w2, b2 = self.arrays
        t, d, hd = ops.shape(x)[1], self.d, self.d // self.heads

        def dense(v, w, b):
            return ops.matmul(v, ops.transpose(w)) + b

        qkv = ops.reshape(dense(_norm(x, ln1s, ln1b, self.eps), wqkv, bqkv), (-1, t, 3, self.heads, hd))
        q, k, v = (ops.transpose(qkv[:, :, i], (0, 2, 1, 3)) for i in range(3))  # (n, heads, t, hd)
        scores = ops.cast(ops.einsum("nhqd,nhkd->nhqk", q, k), "float32") / float(np.sqrt(hd))
        if self.causal:
            mask = ops.tril(ops.ones((t, t), "bool"))
            scores = ops.where(mask, scores, ops.full_like(scores, float("-inf")))
        weights = ops.cast(ops.softmax(scores, axis=-1), v.dtype)
        y = ops.reshape(ops.transpose(ops.einsum("nhqk,nhkd->nhqd", weights, v), (0, 2, 1, 3)), (-1, t, d))
        x = x + dense(y, wp, bp)
        hidden = ops.gelu(dense(_norm(x, ln2s, ln2b, self.eps), w1, b1), approximate=False)
        return x + dense(hidden, w2, b2)

    def compute_output_shape(self, shape):
        return shape


class Embedding(keras.layers.Layer):
    """(N, T) token ids -> (N, T, d): the tokens' embeddings plus the positions', in the
    canonical layout (gpubench.workloads.base.TokenEmbedding)."""

    def __init__(self, vocab: int, d_model: int, tokens: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.vocab, self.d_model, self.tokens = vocab, d_model, tokens

    def build(self, shape) -> None:
        self.table = self.add_weight(shape=(self.vocab, self.d_model), initializer="zeros", name="table")
        self.pos = self.add_weight(shape=(self.tokens, self.d_model), initializer="zeros", name="pos")

    def call(self, x):
        return keras.ops.take(self.table, x, axis=0) + self.pos

    def compute_output_shape(self, shape):
        return (*shape, self.d_model)


class LMHead(keras.layers.Layer):
    """(N, T, d) -> (N, T, vocab), x @ E^T with E the model's token embedding (tied)."""

    def __init__(self, embedding: Embedding, **kwargs) -> None:
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, x):
        return keras.ops.matmul(x, keras.ops.transpose(self.embedding.table))

    def compute_output_shape(self, shape):
        return (*shape[:-1], self.embedding.vocab)


class FirstToken(keras.layers.Layer):
    """(N, T, d) -> (N, d): the class token's features."""

    def call(self, x):
        return x[:, 0]

    def compute_output_shape(self, shape):
        return (shape[0], shape[2])


def leaf_shape(x) -> tuple[int, ...]:
    """A Keras tensor's sample shape in gpubench's layout: (C, H, W) for an image."""
    shape = tuple(x.shape[1:])
    return (shape[2], shape[0], shape[1]) if len(shape) == 3 else shape


class _Builder:
    """Applies spec layers to Keras tensors, keeping each leaf's parametric Keras layer (in
    ``spec.leaves()`` order) to load the canonical weights into."""

    def __init__(self, policy: str | None, seed: int) -> None:
        self.kw = {"dtype": policy} if policy else {}
        self.seed = seed
        self.leaf_layers: list[keras.layers.Layer | None] = []
        self.embedding: Embedding | None = None  # a token embedding, for the tied output head

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
        elif isinstance(layer, PatchEmbed):
            out = Patches(layer.patch, layer.d_model, layer.out_shape(leaf_shape(x))[0], leaf_shape(x)[0], **kw)
        elif isinstance(layer, TransformerBlock):
            out = Block(x.shape[-1], layer.heads, layer.mlp_ratio, layer.causal, layer.eps, **kw)
        elif isinstance(layer, LayerNorm):
            out = kl.LayerNormalization(epsilon=layer.eps, **kw)
        elif isinstance(layer, ClassToken):
            out = FirstToken(**kw)
        elif isinstance(layer, TokenEmbedding):
            out = self.embedding = Embedding(layer.vocab, layer.d_model, x.shape[1], **kw)
        elif isinstance(layer, TiedLMHead):
            assert self.embedding is not None  # the spec puts the token embedding first
            out = LMHead(self.embedding, **kw)
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
    inputs = (keras.Input(shape=spec.input_shape, dtype="int32") if spec.kind == "tokens"
              else keras.Input(shape=nhwc_shape(spec.input_shape)))
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
