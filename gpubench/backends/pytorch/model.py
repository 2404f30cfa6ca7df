"""Translate a framework-neutral WorkloadSpec into a torch.nn.Sequential."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from gpubench.workloads.base import Conv2d, Dropout, Flatten, Layer, Linear, MaxPool2d, ReLU, WorkloadSpec


def _module(layer: Layer, in_shape: tuple[int, ...]) -> nn.Module:
    if isinstance(layer, Conv2d):
        return nn.Conv2d(in_shape[0], layer.out_channels, layer.kernel_size, layer.stride, layer.padding)
    if isinstance(layer, Linear):
        return nn.Linear(in_shape[0], layer.out_features)
    if isinstance(layer, ReLU):
        return nn.ReLU()
    if isinstance(layer, MaxPool2d):
        return nn.MaxPool2d(layer.kernel_size)
    if isinstance(layer, Dropout):
        return nn.Dropout(layer.p)
    if isinstance(layer, Flatten):
        return nn.Flatten()
    raise TypeError(f"the torch backend cannot translate layer {layer!r}")


def build_model(spec: WorkloadSpec, weights: list[list[np.ndarray]] | None = None) -> nn.Sequential:
    """The spec as nn.Sequential, with the canonical weights loaded when given.

    Canonical layout is PyTorch's own, so weights load without transposition.
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
