"""Translate a framework-neutral WorkloadSpec into a torch.nn.Sequential.

Every top-level layer of the spec is one module of the Sequential (a residual block too), so
that tools working on a Sequential (checkpoint_sequential, pipeline splits) see whole blocks.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

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
    Shape,
    WorkloadSpec,
)


class ResidualBlock(nn.Module):
    """``relu(main(x) + shortcut(x))``; an empty shortcut Sequential is the identity."""

    def __init__(self, main: nn.Sequential, shortcut: nn.Sequential) -> None:
        super().__init__()
        self.main = main
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.main(x) + self.shortcut(x))


class GlobalAvgPool2d(nn.Module):
    """(N, C, H, W) -> (N, C): the mean over H and W."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def _branch(layers: tuple[Layer, ...], shape: Shape) -> nn.Sequential:
    modules = []
    for layer in layers:
        modules.append(_module(layer, shape))
        shape = layer.out_shape(shape)
    return nn.Sequential(*modules)


def _module(layer: Layer, in_shape: Shape) -> nn.Module:
    if isinstance(layer, Conv2d):
        return nn.Conv2d(in_shape[0], layer.out_channels, layer.kernel_size, layer.stride, layer.padding,
                         bias=layer.bias)
    if isinstance(layer, Linear):
        return nn.Linear(in_shape[0], layer.out_features)
    if isinstance(layer, BatchNorm2d):
        return nn.BatchNorm2d(in_shape[0], eps=layer.eps, momentum=layer.momentum)
    if isinstance(layer, Residual):
        return ResidualBlock(_branch(layer.main, in_shape), _branch(layer.shortcut, in_shape))
    if isinstance(layer, ReLU):
        return nn.ReLU()
    if isinstance(layer, MaxPool2d):
        return nn.MaxPool2d(layer.kernel_size, layer.step, layer.padding)
    if isinstance(layer, GlobalAvgPool):
        return GlobalAvgPool2d()
    if isinstance(layer, Dropout):
        return nn.Dropout(layer.p)
    if isinstance(layer, Flatten):
        return nn.Flatten()
    raise TypeError(f"the torch backend cannot translate layer {layer!r}")


def build_model(spec: WorkloadSpec, weights: list[list[np.ndarray]] | None = None) -> nn.Sequential:
    """The spec as nn.Sequential, with the canonical weights loaded when given.

    Canonical layout is PyTorch's own, so weights load without transposition (a residual
    block's parameters are registered in the canonical order: main branch, then shortcut).
    """
    model = nn.Sequential(*(_module(layer, i) for layer, (i, _) in zip(spec.layers, spec.shapes())))
    if weights is not None:
        with torch.no_grad():
            for module, arrays in zip(model, weights):
                params = list(module.parameters())
                if len(params) != len(arrays):
                    raise ValueError(f"{module}: {len(params)} parameters, {len(arrays)} arrays")
                for p, a in zip(params, arrays):
                    if tuple(p.shape) != a.shape:
                        raise ValueError(f"{module}: parameter shape {tuple(p.shape)} != {a.shape}")
                    p.copy_(torch.from_numpy(a))
    return model
