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
  multiplies (the ops that dominate; bias adds, activations, pooling, loss and optimizer are
  left out). A training step costs forward + weight-gradient + input-gradient, where the
  input gradient of the first parametric layer is skipped because the data needs none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Union

import numpy as np

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Conv2d:
    out_channels: int
    kernel_size: int
    stride: int = 1
    padding: int = 0
    kind: ClassVar[str] = "conv2d"

    def out_shape(self, shape: Shape) -> Shape:
        c, h, w = _expect_chw(self, shape)
        k, s, p = self.kernel_size, self.stride, self.padding
        return (self.out_channels, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)

    def param_shapes(self, shape: Shape) -> list[Shape]:
        c = shape[0]
        return [(self.out_channels, c, self.kernel_size, self.kernel_size), (self.out_channels,)]

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

    def forward_flops(self, shape: Shape) -> int:
        return 2 * shape[0] * self.out_features


@dataclass(frozen=True)
class ReLU:
    kind: ClassVar[str] = "relu"

    def out_shape(self, shape: Shape) -> Shape:
        return shape


@dataclass(frozen=True)
class MaxPool2d:
    kernel_size: int
    kind: ClassVar[str] = "maxpool2d"

    def out_shape(self, shape: Shape) -> Shape:
        c, h, w = _expect_chw(self, shape)
        k = self.kernel_size
        return (c, h // k, w // k)


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


Layer = Union[Conv2d, Linear, ReLU, MaxPool2d, Dropout, Flatten]


def _expect_chw(layer: object, shape: Shape) -> Shape:
    if len(shape) != 3:
        raise ValueError(f"{type(layer).__name__} needs a (C, H, W) input, got shape {shape}")
    return shape


def has_params(layer: Layer) -> bool:
    return hasattr(layer, "param_shapes")


@dataclass(frozen=True)
class WorkloadSpec:
    """A model, its input and its task, independent of any framework."""

    name: str
    input_shape: Shape
    num_classes: int
    layers: tuple[Layer, ...]
    loss: str = "cross_entropy"

    def shapes(self) -> list[tuple[Shape, Shape]]:
        """(input shape, output shape) of every layer, per sample."""
        out = []
        shape = self.input_shape
        for layer in self.layers:
            nxt = layer.out_shape(shape)
            out.append((shape, nxt))
            shape = nxt
        if shape != (self.num_classes,):
            raise ValueError(f"workload {self.name}: output shape {shape} != ({self.num_classes},)")
        return out

    def param_shapes(self) -> list[list[Shape]]:
        """Per layer, the canonical shapes of its parameters (empty for parameter-free layers)."""
        return [layer.param_shapes(i) if has_params(layer) else [] for layer, (i, _) in zip(self.layers, self.shapes())]

    @property
    def params(self) -> int:
        return sum(math.prod(s) for shapes in self.param_shapes() for s in shapes)

    @property
    def forward_flops_per_sample(self) -> int:
        return sum(layer.forward_flops(i) for layer, (i, _) in zip(self.layers, self.shapes()) if has_params(layer))

    @property
    def train_flops_per_sample(self) -> int:
        """Forward + backward FLOPs of one training sample (see the module docstring)."""
        total = 0
        first = True
        for layer, (i, _) in zip(self.layers, self.shapes()):
            if not has_params(layer):
                continue
            fwd = layer.forward_flops(i)
            total += fwd + fwd  # forward + weight gradient
            if not first:
                total += fwd  # input gradient
            first = False
        return total

    def without_dropout(self) -> WorkloadSpec:
        """The same model with dropout removed (for deterministic cross-framework checks)."""
        return WorkloadSpec(self.name, self.input_shape, self.num_classes,
                            tuple(l for l in self.layers if not isinstance(l, Dropout)), self.loss)

    def init_weights(self, seed: int) -> list[list[np.ndarray]]:
        """Initial weights in canonical layout, from a seeded numpy generator.

        Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases: PyTorch's default
        initialisation, so the distribution is the usual one whichever framework loads it.
        """
        rng = np.random.default_rng([seed, 0])
        weights: list[list[np.ndarray]] = []
        for shapes in self.param_shapes():
            if not shapes:
                weights.append([])
                continue
            fan_in = math.prod(shapes[0][1:])
            bound = 1.0 / math.sqrt(fan_in)
            weights.append([rng.uniform(-bound, bound, size=s).astype(np.float32) for s in shapes])
        return weights


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

    def param_names(self) -> list[str]:
        return [p.name for p in self.params]

    def spec(self, **values: Any) -> WorkloadSpec:
        full = {p.name: values.get(p.name, p.default) for p in self.params}
        return self.build(**full)
