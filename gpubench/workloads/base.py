"""Framework-neutral workload specs.

A workload is described once, as a list of layer specs with an input shape and a number of
classes. Backends translate the spec; parameter counts, FLOPs and initial weights are
computed here, from the spec alone, so that "identical in every framework" is true by
construction and can be checked against each framework's own counters.

Conventions (documented in docs/results-schema.md):
- shapes are per sample, channels first: (C, H, W) or (features,);
- canonical weight layout is PyTorch's: conv (out, in, kh, kw), linear (out, in); a flatten
  after a conv stack flattens in (C, H, W) order. Backends with other layouts convert;
- FLOPs count a multiply-accumulate as 2 and include only convolutions and matrix
  multiplies (the ops that dominate; bias adds, batch norm, activations, pooling, loss and
  optimizer are left out). A training step costs forward + weight-gradient + input-gradient,
  where the input gradient is skipped for a layer whose input needs none (no parametric layer
  before it: the first convolution or linear layer, whose input is the data);
- a Residual layer nests branches of layers; shapes, parameters, FLOPs and initial weights
  recurse through it (main branch first, then the shortcut). Canonical weights are one list
  of arrays per top-level layer, a residual block's being its leaves' arrays in that order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypeGuard, Union, get_args

import numpy as np

Shape = tuple[int, ...]
_CHW, _TD = ("C", "H", "W"), ("tokens", "width")  # the input axes of an image's layers, of a sequence's


def _fan_in_uniform(shapes: list[Shape], rng: np.random.Generator) -> list[np.ndarray]:
    """Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the weight and its bias: PyTorch's default
    initialisation of convolutions and linear layers."""
    bound = 1.0 / math.sqrt(math.prod(shapes[0][1:]))
    return [rng.uniform(-bound, bound, size=s).astype(np.float32) for s in shapes]


def _pooled(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


@dataclass(frozen=True)
class Conv2d:
    out_channels: int
    kernel_size: int
    stride: int = 1
    padding: int = 0  # zeros on every side
    bias: bool = True
    kind: ClassVar[str] = "conv2d"

    def out_shape(self, shape: Shape) -> Shape:
        c, h, w = _expect(self, shape, _CHW)
        k, s, p = self.kernel_size, self.stride, self.padding
        return (self.out_channels, _pooled(h, k, s, p), _pooled(w, k, s, p))

    def param_shapes(self, shape: Shape) -> list[Shape]:
        c = shape[0]
        weight = (self.out_channels, c, self.kernel_size, self.kernel_size)
        return [weight, (self.out_channels,)] if self.bias else [weight]

    def init_params(self, shape: Shape, rng: np.random.Generator) -> list[np.ndarray]:
        return _fan_in_uniform(self.param_shapes(shape), rng)

    def forward_flops(self, shape: Shape) -> int:
        c = shape[0]
        _, ho, wo = self.out_shape(shape)
        return 2 * c * self.kernel_size * self.kernel_size * self.out_channels * ho * wo


@dataclass(frozen=True)
class Linear:
    out_features: int
    kind: ClassVar[str] = "linear"

    def out_shape(self, shape: Shape) -> Shape:
        if len(shape) != 1:
            raise ValueError(f"linear layer needs a flat input, got shape {shape}")
        return (self.out_features,)

    def param_shapes(self, shape: Shape) -> list[Shape]:
        return [(self.out_features, shape[0]), (self.out_features,)]

    def init_params(self, shape: Shape, rng: np.random.Generator) -> list[np.ndarray]:
        return _fan_in_uniform(self.param_shapes(shape), rng)

    def forward_flops(self, shape: Shape) -> int:
        return 2 * shape[0] * self.out_features


@dataclass(frozen=True)
class BatchNorm2d:
    """Batch normalisation over (N, H, W) per channel. Training uses the batch statistics;
    the running statistics are buffers (not parameters), updated as
    ``running = (1 - momentum) * running + momentum * batch`` (PyTorch's convention; Keras'
    momentum is ``1 - momentum``)."""

    eps: float = 1e-5
    momentum: float = 0.1
    kind: ClassVar[str] = "batchnorm2d"

    def out_shape(self, shape: Shape) -> Shape:
        _expect(self, shape, _CHW)
        return shape

    def param_shapes(self, shape: Shape) -> list[Shape]:
        return [(shape[0],), (shape[0],)]  # gamma (scale), beta (shift)

    def init_params(self, shape: Shape, rng: np.random.Generator) -> list[np.ndarray]:
        return [np.ones(shape[0], np.float32), np.zeros(shape[0], np.float32)]


@dataclass(frozen=True)
class GlobalAvgPool:
    """The mean over H and W: (C, H, W) -> (C,)."""

    kind: ClassVar[str] = "globalavgpool"

    def out_shape(self, shape: Shape) -> Shape:
        return (_expect(self, shape, _CHW)[0],)


@dataclass(frozen=True)
class ReLU:
    kind: ClassVar[str] = "relu"

    def out_shape(self, shape: Shape) -> Shape:
        return shape


@dataclass(frozen=True)
class MaxPool2d:
    kernel_size: int
    stride: int | None = None  # None: the kernel size
    padding: int = 0  # on every side; padded positions never win the max
    kind: ClassVar[str] = "maxpool2d"

    @property
    def step(self) -> int:
        return self.kernel_size if self.stride is None else self.stride

    def out_shape(self, shape: Shape) -> Shape:
        c, h, w = _expect(self, shape, _CHW)
        k, s, p = self.kernel_size, self.step, self.padding
        return (c, _pooled(h, k, s, p), _pooled(w, k, s, p))


@dataclass(frozen=True)
class Dropout:
    p: float
    kind: ClassVar[str] = "dropout"

    def out_shape(self, shape: Shape) -> Shape:
        return shape


@dataclass(frozen=True)
class Flatten:
    kind: ClassVar[str] = "flatten"

    def out_shape(self, shape: Shape) -> Shape:
        return (math.prod(shape),)


@dataclass(frozen=True)
class Residual:
    """``relu(main(x) + shortcut(x))``: a residual block; an empty shortcut is the identity.
    Backends translate it as one unit (one module, one block of layers)."""

    main: tuple[Layer, ...]
    shortcut: tuple[Layer, ...] = ()
    kind: ClassVar[str] = "residual"

    def out_shape(self, shape: Shape) -> Shape:
        return walk((self,), shape)[1]


def _normal(shape: Shape, rng: np.random.Generator, std: float = 0.02) -> np.ndarray:
    return rng.normal(0.0, std, size=shape).astype(np.float32)


@dataclass(frozen=True)
class PatchEmbed:
    """An image cut into ``patch`` x ``patch`` patches, each projected to ``d_model`` (a
    convolution with stride = kernel = patch), a learned class token put first and learned
    position embeddings added: (C, H, W) -> (1 + H/p x W/p, d_model), the patches in row-major
    order. Parameters: the projection's weight (d_model, C, p, p) and bias (PyTorch's
    initialisation), the class token (d_model,) and the positions (tokens, d_model), both
    Normal(0, 0.02)."""

    patch: int
    d_model: int
    kind: ClassVar[str] = "patch_embed"

    def _grid(self, shape: Shape) -> tuple[int, int, int]:
        c, h, w = _expect(self, shape, _CHW)
        if h % self.patch or w % self.patch:
            raise ValueError(f"patch {self.patch} does not divide the image ({h} x {w})")
        return c, h // self.patch, w // self.patch

    def out_shape(self, shape: Shape) -> Shape:
        _, gh, gw = self._grid(shape)
        return (1 + gh * gw, self.d_model)

    def param_shapes(self, shape: Shape) -> list[Shape]:
        c, gh, gw = self._grid(shape)
        return [(self.d_model, c, self.patch, self.patch), (self.d_model,), (self.d_model,),
                (1 + gh * gw, self.d_model)]

    def init_params(self, shape: Shape, rng: np.random.Generator) -> list[np.ndarray]:
        weight, bias, cls, pos = self.param_shapes(shape)
        return [*_fan_in_uniform([weight, bias], rng), _normal(cls, rng), _normal(pos, rng)]

    def forward_flops(self, shape: Shape) -> int:
        c, gh, gw = self._grid(shape)
        return 2 * c * self.patch * self.patch * self.d_model * gh * gw


@dataclass(frozen=True)
class LayerNorm:
    """Layer normalisation over the last axis (the width), with a scale and a shift."""

    eps: float = 1e-5
    kind: ClassVar[str] = "layernorm"

    def out_shape(self, shape: Shape) -> Shape:
        return shape

    def param_shapes(self, shape: Shape) -> list[Shape]:
        return [(shape[-1],), (shape[-1],)]

    def init_params(self, shape: Shape, rng: np.random.Generator) -> list[np.ndarray]:
        return [np.ones(shape[-1], np.float32), np.zeros(shape[-1], np.float32)]


@dataclass(frozen=True)
class TransformerBlock:
    """A pre-LN transformer block on (tokens, d_model): ``x + proj(attention(ln1(x)))``, then
    ``x + fc2(gelu(fc1(ln2(x))))``. Attention: ``heads`` heads of d_model / heads, queries, keys
    and values from one projection (rows: all the queries' then the keys' then the values', head
    by head), softmax(q k^T / sqrt(d_head)) v, with a causal mask when ``causal``; GELU is the
    exact (erf) one; layer norms' epsilon 1e-5. Parameters, in order: ln1 scale and shift, qkv
    (3 d, d) and bias, proj (d, d) and bias, ln2 scale and shift, fc1 (mlp_ratio d, d) and bias,
    fc2 (d, mlp_ratio d) and bias; weights Normal(0, 0.02) (GPT-2's and ViT's), biases 0.

    FLOPs (multiply-accumulate = 2) per sample of T tokens: the four projections, 2 T (3d^2 +
    d^2 + 2 r d^2) with r = mlp_ratio, and attention's two matrix products, q k^T and the
    weights times v, 4 T^2 d, counted over the whole T x T square even when causal (as nanoGPT
    and PaLM count them: a kernel that skips the masked half does less work than counted)."""

    heads: int
    mlp_ratio: int = 4
    causal: bool = False
    eps: float = 1e-5
    kind: ClassVar[str] = "transformer_block"

    def _width(self, shape: Shape) -> int:
        d = _expect(self, shape, _TD)[1]
        if d % self.heads:
            raise ValueError(f"{self.heads} heads do not divide the width {d}")
        return d

    def out_shape(self, shape: Shape) -> Shape:
        self._width(shape)
        return shape

    @staticmethod
    def qkv_row_order(d: int, groups: int) -> np.ndarray:
        """The q, k, v projection's rows reordered into ``groups`` contiguous chunks, chunk r
        holding (q, k, v) of heads r x heads/groups onwards: what tensor parallelism splits, so
        that a contiguous split of the rows gives each device whole heads (the model computes
        what it did where its attention reads q, k and v in that order)."""
        per = d // groups
        return np.concatenate([np.arange(c * d + r * per, c * d + (r + 1) * per) for r in range(groups)
                               for c in range(3)])

    def param_shapes(self, shape: Shape) -> list[Shape]:
        d = self._width(shape)
        h = self.mlp_ratio * d
        return [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (h, d), (h,), (d, h), (d,)]

    def init_params(self, shape: Shape, rng: np.random.Generator) -> list[np.ndarray]:
        # 0 and 6 are the layer norms' scales
        return [np.ones(s, np.float32) if i in (0, 6) else _normal(s, rng) if len(s) == 2 else np.zeros(s, np.float32)
                for i, s in enumerate(self.param_shapes(shape))]

    def forward_flops(self, shape: Shape) -> int:
        t, d = shape[0], self._width(shape)
        return 2 * t * (3 * d * d + d * d + 2 * self.mlp_ratio * d * d) + 4 * t * t * d


@dataclass(frozen=True)
class TokenEmbedding:
    """Token ids (T,) -> (T, d_model): a learned embedding of each of ``vocab`` tokens plus a
    learned embedding of each position. Parameters: the token embedding (vocab, d_model) and the
    positions (T, d_model), both Normal(0, 0.02) (GPT-2's)."""

    vocab: int
    d_model: int
    kind: ClassVar[str] = "token_embedding"

    def out_shape(self, shape: Shape) -> Shape:
        if len(shape) != 1:
            raise ValueError(f"TokenEmbedding needs a (tokens,) input, got shape {shape}")
        return (shape[0], self.d_model)

    def param_shapes(self, shape: Shape) -> list[Shape]:
        return [(self.vocab, self.d_model), (shape[0], self.d_model)]

    def init_params(self, shape: Shape, rng: np.random.Generator) -> list[np.ndarray]:
        return [_normal(s, rng) for s in self.param_shapes(shape)]


@dataclass(frozen=True)
class TiedLMHead:
    """(T, d) -> (T, vocab): each position's scores over the vocabulary, x @ E^T with E the
    model's TokenEmbedding (weight tying: no parameters of its own, as GPT-2)."""

    vocab: int
    kind: ClassVar[str] = "tied_lm_head"

    def out_shape(self, shape: Shape) -> Shape:
        return (_expect(self, shape, _TD)[0], self.vocab)

    def forward_flops(self, shape: Shape) -> int:
        t, d = _expect(self, shape, _TD)
        return 2 * t * d * self.vocab


@dataclass(frozen=True)
class ClassToken:
    """The first token of a sequence (the class token PatchEmbed puts first): (T, d) -> (d,)."""

    kind: ClassVar[str] = "class_token"

    def out_shape(self, shape: Shape) -> Shape:
        return (_expect(self, shape, _TD)[1],)


# runtime aliases (3.10): the layers, and those with parameters
Parametric = Union[Conv2d, Linear, BatchNorm2d, PatchEmbed, LayerNorm, TransformerBlock, TokenEmbedding]  # noqa: UP007
Layer = Union[Parametric, ReLU, MaxPool2d, Dropout, Flatten, GlobalAvgPool, Residual, ClassToken, TiedLMHead]  # noqa: UP007


def _expect(layer: object, shape: Shape, axes: tuple[str, ...]) -> Shape:
    if len(shape) != len(axes):
        raise ValueError(f"{type(layer).__name__} needs a ({', '.join(axes)}) input, got shape {shape}")
    return shape


def has_params(layer: Layer) -> TypeGuard[Parametric]:
    return isinstance(layer, get_args(Parametric))


@dataclass(frozen=True)
class Leaf:
    """A non-residual layer where it sits in the model: its input shape, and whether the
    backward pass computes its input gradient (only after some parametric layer)."""

    layer: Layer
    in_shape: Shape
    input_grad: bool

    def param_shapes(self) -> list[Shape]:
        return self.layer.param_shapes(self.in_shape) if has_params(self.layer) else []

    def forward_flops(self) -> int:
        return self.layer.forward_flops(self.in_shape) if hasattr(self.layer, "forward_flops") else 0


def walk(layers: tuple[Layer, ...], shape: Shape, grad: bool = False) -> tuple[list[Leaf], Shape, bool]:
    """The leaves of ``layers`` in execution order (a residual block's main branch, then its
    shortcut), the output shape, and whether the output depends on a parameter."""
    leaves: list[Leaf] = []
    for layer in layers:
        if isinstance(layer, Residual):
            main, main_shape, main_grad = walk(layer.main, shape, grad)
            short, short_shape, short_grad = walk(layer.shortcut, shape, grad)
            if main_shape != short_shape:
                raise ValueError(f"residual block: main branch gives {main_shape}, shortcut {short_shape}")
            leaves += main + short
            shape, grad = main_shape, main_grad or short_grad
        else:
            leaves.append(Leaf(layer, shape, grad))
            shape, grad = layer.out_shape(shape), grad or has_params(layer)
    return leaves, shape, grad


def _without_dropout(layers: tuple[Layer, ...]) -> tuple[Layer, ...]:
    return tuple(Residual(_without_dropout(x.main), _without_dropout(x.shortcut)) if isinstance(x, Residual) else x
                 for x in layers if not isinstance(x, Dropout))


@dataclass(frozen=True)
class WorkloadSpec:
    """A model, its input and its task, independent of any framework."""

    name: str
    input_shape: Shape
    num_classes: int
    layers: tuple[Layer, ...]
    loss: str = "cross_entropy"
    # "classes": a float sample -> scores over num_classes; "tokens": a sequence of token ids
    # (input_shape = (T,)) -> each position's scores over a vocabulary of num_classes, trained
    # to predict the next token (gpubench.workloads.data.synthetic_tokens)
    kind: str = "classes"

    def shapes(self) -> list[tuple[Shape, Shape]]:
        """(input shape, output shape) of every top-level layer, per sample."""
        out = []
        shape = self.input_shape
        for layer in self.layers:
            nxt = layer.out_shape(shape)
            out.append((shape, nxt))
            shape = nxt
        self._check_output(shape)
        return out

    @property
    def output_shape(self) -> Shape:
        return (self.input_shape[0], self.num_classes) if self.kind == "tokens" else (self.num_classes,)

    def _check_output(self, shape: Shape) -> None:
        if shape != self.output_shape:
            raise ValueError(f"workload {self.name}: output shape {shape} != {self.output_shape}")

    def leaves_by_layer(self) -> list[list[Leaf]]:
        """Per top-level layer, its leaves (one for a plain layer); checks the output shape."""
        out: list[list[Leaf]] = []
        shape, grad = self.input_shape, False
        for layer in self.layers:
            leaves, shape, grad = walk((layer,), shape, grad)
            out.append(leaves)
        self._check_output(shape)
        return out

    def leaves(self) -> list[Leaf]:
        """Every non-residual layer, in execution order."""
        return [leaf for leaves in self.leaves_by_layer() for leaf in leaves]

    def transformer_blocks(self) -> list[tuple[TransformerBlock, int]]:
        """The top-level transformer blocks, each with its width (d_model): what a backend's
        tensor parallelism splits."""
        return [(layer, leaves[0].in_shape[-1]) for layer, leaves in zip(self.layers, self.leaves_by_layer())
                if isinstance(layer, TransformerBlock)]

    def tensor_split_problem(self, n: int) -> str | None:
        """Why ``tp:n`` cannot split these transformer blocks, or None: each device takes 1/n of
        the attention heads, of d_model and of the MLP's hidden units (the rule of every
        backend's tensor parallelism, checked before a worker starts)."""
        for block, d in self.transformer_blocks():
            bad = [f"{name} {size}" for name, size in (("heads", block.heads), ("d_model", d),
                                                       ("MLP width", block.mlp_ratio * d)) if size % n]
            if bad:
                return (f"tp:{n} gives each device 1/{n} of the attention heads and of the MLP's hidden units; {n} "
                        f"does not divide {', '.join(bad)}")
        return None

    def param_shapes(self) -> list[list[Shape]]:
        """Per top-level layer, the canonical shapes of its parameters (empty for parameter-free
        layers; a residual block's are its leaves' in order)."""
        return [[s for leaf in leaves for s in leaf.param_shapes()] for leaves in self.leaves_by_layer()]

    @property
    def params(self) -> int:
        return sum(math.prod(s) for shapes in self.param_shapes() for s in shapes)

    @property
    def forward_flops_per_sample(self) -> int:
        return sum(leaf.forward_flops() for leaf in self.leaves())

    @property
    def train_flops_per_sample(self) -> int:
        """Forward + backward FLOPs of one training sample (see the module docstring)."""
        return sum((3 if leaf.input_grad else 2) * leaf.forward_flops() for leaf in self.leaves())

    def facts(self) -> dict[str, Any]:
        """The result's ``model`` block for this spec (the same in every framework)."""
        attention = any(isinstance(layer, TransformerBlock) for layer in self.layers)
        facts = {"params": self.params, "flops_per_sample": self.train_flops_per_sample,
                 "forward_flops_per_sample": self.forward_flops_per_sample, "source": "builtin", "identical": True,
                 "flops_counted_by": "gpubench, from the spec (convolutions and matrix multiplies"
                                     + ("; attention over the full T x T square, causal or not, as nanoGPT and PaLM "
                                        "count it" if attention else "") + ")"}
        if self.kind == "tokens":  # a sample is a sequence: tokens/s is throughput x its length
            facts.update(task="tokens", tokens_per_sample=self.input_shape[0])
        return facts

    def for_task(self, input_shape: Shape, num_classes: int) -> WorkloadSpec:
        """The same model for another classification task (a user's data set): its input, and its
        last linear layer scoring ``num_classes``; ValueError where the layers do not fit the input."""
        layers = self.layers
        if self.kind != "classes" or not layers or not isinstance(layers[-1], Linear):
            raise ValueError(f"workload {self.name} classifies {self.kind}, not a data set's samples")
        spec = replace(self, input_shape=tuple(input_shape), num_classes=num_classes,
                       layers=(*layers[:-1], Linear(num_classes)))
        try:
            spec.shapes()
        except ValueError as e:
            raise ValueError(f"workload {self.name} does not take samples of shape {list(input_shape)}: {e}") from None
        return spec

    def without_dropout(self) -> WorkloadSpec:
        """The same model with dropout removed (for deterministic cross-framework checks)."""
        return replace(self, layers=_without_dropout(self.layers))

    def init_weights(self, seed: int) -> list[list[np.ndarray]]:
        """Initial weights in canonical layout, per top-level layer, from a seeded numpy
        generator: PyTorch's default initialisation, so the distribution is the usual one
        whichever framework loads it. Convolutions and linear layers: Uniform(-1/sqrt(fan_in),
        1/sqrt(fan_in)) for weights and biases; batch norm: scale 1, shift 0."""
        rng = np.random.default_rng([seed, 0])
        return [[a for leaf in leaves if has_params(leaf.layer) for a in leaf.layer.init_params(leaf.in_shape, rng)]
                for leaves in self.leaves_by_layer()]


@dataclass(frozen=True)
class Param:
    """A suite-settable workload parameter (e.g. the depth of the MLP)."""

    name: str
    default: int
    minimum: int
    help: str


@dataclass(frozen=True)
class Workload:
    """A named family of specs, built from its parameters."""

    name: str
    description: str
    build: Callable[..., WorkloadSpec]
    params: tuple[Param, ...] = field(default_factory=tuple)
    attention: bool = False  # its layers compute attention (the `attention` setting applies)

    def param_names(self) -> list[str]:
        return [p.name for p in self.params]

    def spec(self, **values: Any) -> WorkloadSpec:
        full = {p.name: values.get(p.name, p.default) for p in self.params}
        return self.build(**full)
