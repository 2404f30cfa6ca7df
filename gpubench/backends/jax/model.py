"""Translate a framework-neutral WorkloadSpec into a pure JAX function over the canonical weights.

No layout conversion is needed: JAX's convolution takes any dimension order, so the model runs
on gpubench's own layout (NCHW activations, OIHW and (out, in) weights) and XLA chooses the
physical layout of each op for the device. The parameters are the spec's canonical weights,
one list of arrays per top-level layer (``WorkloadSpec.init_weights``); the state is the batch
norms' running statistics, one ``(mean, var)`` pair per batch-norm leaf of each top-level layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import DTypeLike

from gpubench.backends.base import Tree
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

Params = list[list[jax.Array]]
Stats = list[tuple[jax.Array, jax.Array]]  # one layer's batch norms' running (mean, var)
State = list[Stats]


@dataclass(frozen=True)
class Policy:
    """How a step computes: ``compute`` the dtype of activations and of the operands of
    convolutions and matrix multiplies (the parameters stay float32, cast where used, as
    PyTorch's autocast does); ``precision`` the precision of float32 convolutions and matrix
    multiplies (HIGHEST: true fp32; DEFAULT: lets the GPU use TF32)."""

    compute: DTypeLike = jnp.float32
    precision: lax.Precision = lax.Precision.HIGHEST


_POLICIES = {"amp-bf16": Policy(jnp.bfloat16, lax.Precision.DEFAULT),
             "amp-fp16": Policy(jnp.float16, lax.Precision.DEFAULT),
             "tf32": Policy(jnp.float32, lax.Precision.DEFAULT)}


def policy_for(precision: str) -> Policy:
    return _POLICIES.get(precision, Policy())


def init_state(spec: WorkloadSpec) -> State:
    """The batch norms' running statistics as PyTorch starts them: mean 0, variance 1."""
    return [[(jnp.zeros(leaf.in_shape[0], jnp.float32), jnp.ones(leaf.in_shape[0], jnp.float32))
             for leaf in leaves if isinstance(leaf.layer, BatchNorm2d)] for leaves in spec.leaves_by_layer()]


def to_params(weights: list[list[np.ndarray]]) -> Params:
    return [[jnp.asarray(a, jnp.float32) for a in arrays] for arrays in weights]


def _layer_norm(x: jax.Array, scale: jax.Array, shift: jax.Array, eps: float) -> jax.Array:
    """Over the last axis, in float32 whatever the compute dtype (as PyTorch's autocast runs it)."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(axis=-1, keepdims=True)
    var = ((xf - mean) ** 2).mean(axis=-1, keepdims=True)
    return (((xf - mean) * lax.rsqrt(var + eps)) * scale + shift).astype(x.dtype)


def _dense(x: jax.Array, w: jax.Array, b: jax.Array, policy: Policy) -> jax.Array:
    cd = policy.compute
    return jnp.matmul(x.astype(cd), w.astype(cd).T, precision=policy.precision) + b.astype(cd)


def _attention(layer: TransformerBlock, q: jax.Array, k: jax.Array, v: jax.Array, policy: Policy,
               attention: str) -> jax.Array:
    """Multi-head attention of (n, t, heads, d_head) queries, keys and values: ``math``, its two
    matrix products with the softmax in float32; ``sdpa``, ``jax.nn.dot_product_attention`` with
    its default implementation (XLA's: its own fusion of the same products); ``cudnn``, that
    function's cuDNN kernel. The float32 policy's precision holds inside the library's products
    too (no TF32 at fp32)."""
    t, hd = q.shape[1], q.shape[3]
    if attention == "math":
        scores = jnp.einsum("nqhd,nkhd->nhqk", q, k, precision=policy.precision).astype(jnp.float32) / np.sqrt(hd)
        if layer.causal:
            scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -jnp.inf)
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        return jnp.einsum("nhqk,nkhd->nqhd", weights, v, precision=policy.precision)
    highest = policy.precision == lax.Precision.HIGHEST
    with jax.default_matmul_precision("highest" if highest else "default"):
        return jax.nn.dot_product_attention(q, k, v, is_causal=layer.causal,
                                            implementation="cudnn" if attention == "cudnn" else None)


def interleave_qkv(weights: list[list[np.ndarray]], spec: WorkloadSpec, groups: int) -> list[list[np.ndarray]]:
    """The canonical weights with each transformer block's fused q, k, v rows in ``groups``
    chunks of whole heads (TransformerBlock.qkv_row_order: ``tp:N``'s split; the blocks read the
    rows in that order)."""
    out = [list(arrays) for arrays in weights]
    for layer, arrays in zip(spec.layers, out):
        if isinstance(layer, TransformerBlock) and groups > 1:
            order = TransformerBlock.qkv_row_order(arrays[2].shape[1], groups)
            arrays[2], arrays[3] = arrays[2][order], arrays[3][order]
    return out


def _block(layer: TransformerBlock, x: jax.Array, p: list[jax.Array], policy: Policy, attention: str,
           groups: int = 1) -> jax.Array:
    """A pre-LN transformer block (gpubench.workloads.base.TransformerBlock); ``groups``: its q,
    k, v rows are in that many chunks of whole heads (interleave_qkv)."""
    ln1s, ln1b, wqkv, bqkv, wp, bp, ln2s, ln2b, w1, b1, w2, b2 = p
    n, t, d = x.shape
    hd = d // layer.heads
    qkv = _dense(_layer_norm(x, ln1s, ln1b, layer.eps), wqkv, bqkv, policy)
    # (n, t, chunk, q|k|v, the chunk's heads, hd) -> each of q, k, v (n, t, heads, hd), in head order
    q, k, v = (qkv.reshape(n, t, groups, 3, layer.heads // groups, hd).transpose(3, 0, 1, 2, 4, 5)
               .reshape(3, n, t, layer.heads, hd))
    y = _attention(layer, q, k, v, policy, attention)
    x = x + _dense(y.reshape(n, t, d), wp, bp, policy)
    hidden = jax.nn.gelu(_dense(_layer_norm(x, ln2s, ln2b, layer.eps), w1, b1, policy), approximate=False)
    return x + _dense(hidden, w2, b2, policy)


class _Apply:
    """One forward pass: walks the spec, taking each leaf's parameters and running statistics
    in order (a residual block's main branch, then its shortcut), and collects the new
    running statistics."""

    def __init__(self, policy: Policy, train: bool, key: jax.Array | None, tied: jax.Array | None = None,
                 attention: str = "sdpa", groups: int = 1) -> None:
        self.policy, self.train, self.key, self.attention = policy, train, key, attention
        self.groups = groups  # the q, k, v rows' chunks of whole heads (interleave_qkv)
        self.leaf = 0  # the leaf's position in the whole model, for its dropout key
        self.tied = tied  # the token embedding, the weight of a tied output head

    def chain(self, layers: tuple[Layer, ...], x: jax.Array, params: Iterator[jax.Array],
              stats: Iterator[tuple[jax.Array, jax.Array]], new: Stats) -> jax.Array:
        for layer in layers:
            x = self.apply(layer, x, params, stats, new)
        return x

    def apply(self, layer: Layer, x: jax.Array, params: Iterator[jax.Array],
              stats: Iterator[tuple[jax.Array, jax.Array]], new: Stats) -> jax.Array:
        cd, prec = self.policy.compute, self.policy.precision
        if isinstance(layer, Residual):
            main = self.chain(layer.main, x, params, stats, new)
            shortcut = self.chain(layer.shortcut, x, params, stats, new)
            return jax.nn.relu(main + shortcut)
        index, self.leaf = self.leaf, self.leaf + 1
        if isinstance(layer, Conv2d):
            w = next(params).astype(cd)
            p = layer.padding
            y = lax.conv_general_dilated(x.astype(cd), w, (layer.stride, layer.stride), [(p, p), (p, p)],
                                         dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=prec)
            return y + next(params).astype(cd)[None, :, None, None] if layer.bias else y
        if isinstance(layer, Linear):
            return _dense(x, next(params), next(params), self.policy)
        if isinstance(layer, BatchNorm2d):
            gamma, beta = next(params), next(params)
            mean_r, var_r = next(stats)
            xf = x.astype(jnp.float32)  # statistics in float32 whatever the compute dtype
            if self.train:
                mean = xf.mean(axis=(0, 2, 3))
                var = xf.var(axis=(0, 2, 3))
                n = x.shape[0] * x.shape[2] * x.shape[3]
                m = layer.momentum  # PyTorch's: the running variance is the unbiased one
                new.append(((1 - m) * mean_r + m * mean, (1 - m) * var_r + m * var * n / max(n - 1, 1)))
            else:
                mean, var = mean_r, var_r
                new.append((mean_r, var_r))
            y = (xf - mean[None, :, None, None]) * lax.rsqrt(var[None, :, None, None] + layer.eps)
            return (y * gamma[None, :, None, None] + beta[None, :, None, None]).astype(x.dtype)
        if isinstance(layer, PatchEmbed):
            w, b, cls, pos = (next(params) for _ in range(4))
            y = lax.conv_general_dilated(x.astype(cd), w.astype(cd), (layer.patch, layer.patch), "VALID",
                                         dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=prec)
            y = (y + b.astype(cd)[None, :, None, None]).reshape(y.shape[0], y.shape[1], -1).transpose(0, 2, 1)
            first = jnp.broadcast_to(cls.astype(cd), (y.shape[0], 1, y.shape[2]))
            return jnp.concatenate([first, y], axis=1) + pos.astype(cd)
        if isinstance(layer, LayerNorm):
            return _layer_norm(x, next(params), next(params), layer.eps)
        if isinstance(layer, TransformerBlock):
            return _block(layer, x, [next(params) for _ in range(12)], self.policy, self.attention, self.groups)
        if isinstance(layer, ClassToken):
            return x[:, 0]
        if isinstance(layer, TokenEmbedding):
            table, pos = next(params), next(params)
            return (table[x] + pos).astype(cd)
        if isinstance(layer, TiedLMHead):
            assert self.tied is not None  # forward() finds the model's token embedding
            return jnp.matmul(x.astype(cd), self.tied.astype(cd).T, precision=prec)
        if isinstance(layer, ReLU):
            return jax.nn.relu(x)
        if isinstance(layer, MaxPool2d):
            k, s, p = layer.kernel_size, layer.step, layer.padding  # padded positions never win
            return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, k, k), (1, 1, s, s),
                                     [(0, 0), (0, 0), (p, p), (p, p)])
        if isinstance(layer, GlobalAvgPool):
            return x.mean(axis=(2, 3))
        if isinstance(layer, Dropout):
            if not self.train or layer.p == 0:
                return x
            assert self.key is not None  # a training step always passes its key
            keep = jax.random.bernoulli(jax.random.fold_in(self.key, index), 1.0 - layer.p, x.shape)
            return jnp.where(keep, x / (1.0 - layer.p), jnp.zeros((), x.dtype)).astype(x.dtype)
        if isinstance(layer, Flatten):
            return x.reshape(x.shape[0], -1)  # (C, H, W) order: the canonical one
        raise TypeError(f"the jax backend cannot translate layer {layer!r}")


def forward(spec: WorkloadSpec, params: Params, state: State, x: jax.Array, *, train: bool,
            policy: Policy | None = None, key: jax.Array | None = None, remat: bool = False,
            attention: str = "sdpa", groups: int = 1) -> tuple[jax.Array, State]:
    """The logits (float32) of a batch in gpubench's layout, and the new running statistics.
    ``remat``: each top-level layer's activations are recomputed in the backward pass
    (``jax.checkpoint``), as activation checkpointing does in PyTorch; ``attention``: how a
    transformer's blocks compute it (the attention setting); ``groups``: the chunks of
    whole heads their q, k, v rows are in (interleave_qkv)."""
    tied = next((arrays[0] for layer, arrays in zip(spec.layers, params) if isinstance(layer, TokenEmbedding)), None)
    run = _Apply(policy or Policy(), train, key, tied, attention, groups)
    new_state: State = []
    for layer, arrays, stats in zip(spec.layers, params, state, strict=True):
        def one(x: jax.Array, arrays: list[jax.Array], stats: Stats, layer: Layer = layer,
                start: int = run.leaf) -> tuple[jax.Array, Stats]:
            run.leaf = start  # the same dropout keys when the layer is recomputed
            new: Stats = []
            return run.apply(layer, x, iter(arrays), iter(stats), new), new

        x, new = (jax.checkpoint(one) if remat and arrays else one)(x, arrays, stats)
        new_state.append(new)
    return x.astype(jnp.float32), new_state


@dataclass(frozen=True)
class JaxModel:
    """A model as the JAX trainer takes it, whatever its source: its initial ``params`` and
    ``state`` (pytrees: batch norm's running statistics, or a Flax module's non-parameter
    collections; ``{}`` or ``[]`` where none), and ``apply(params, state, x, train, policy, key,
    remat) -> (output, new state)``."""

    params: Tree[jax.Array]
    state: Tree[jax.Array]
    apply: Callable[..., tuple[object, Tree[jax.Array]]]

    def infer(self, x: Tree[np.ndarray]) -> object:
        """The output of an inference pass on the host batch ``x``, at the initial weights."""
        from gpubench.workloads.data import tree_map

        return self.apply(self.params, self.state, tree_map(jnp.asarray, x), False, None, None, False)[0]


def spec_model(spec: WorkloadSpec, seed: int, attention: str = "sdpa", groups: int = 1) -> JaxModel:
    """A built-in workload: the canonical weights and the spec's forward; ``groups`` > 1
    (``tp:N``): each transformer block's q, k, v rows in that many chunks of whole heads
    (interleave_qkv), the same model."""
    def apply(params: Params, state: State, x: jax.Array, train: bool, policy: Policy | None, key: jax.Array | None,
              remat: bool) -> tuple[jax.Array, State]:
        return forward(spec, params, state, x, train=train, policy=policy, key=key, remat=remat, attention=attention,
                       groups=groups)

    return JaxModel(to_params(interleave_qkv(spec.init_weights(seed), spec, groups)), init_state(spec), apply)


def logits_of(out: object) -> jax.Array:
    """The scores in a model's output: an array, a dict's ``"logits"``, an object's ``logits``,
    or a tuple's first element."""
    if isinstance(out, jax.Array):
        return out
    if isinstance(out, dict) and "logits" in out:
        return out["logits"]
    if (logits := getattr(out, "logits", None)) is not None:
        return logits
    if isinstance(out, (tuple, list)) and out:
        return out[0]
    raise TypeError(f"the model returned {type(out).__name__}, which holds no logits array; name a loss function "
                    "(loss = \"module:function\") that takes this output")


def cross_entropy(out: object, y: jax.Array) -> jax.Array:
    """Mean cross-entropy of the logits against class targets, (N, C) vs (N,) or a sequence's
    (N, T, V) vs (N, T), in float32."""
    import optax

    return optax.softmax_cross_entropy_with_integer_labels(logits_of(out).astype(jnp.float32), y).mean()
