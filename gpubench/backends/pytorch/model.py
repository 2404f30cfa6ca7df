"""Translate a framework-neutral WorkloadSpec into a torch.nn.Sequential.

Every top-level layer of the spec is one module of the Sequential (a residual block too), so
that tools working on a Sequential (checkpoint_sequential, pipeline splits) see whole blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

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
    Shape,
    TiedLMHead,
    TokenEmbedding,
    TransformerBlock,
    WorkloadSpec,
)

if TYPE_CHECKING:
    from torch.nn.attention import SDPBackend


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


class Patches(nn.Module):
    """(N, C, H, W) -> (N, 1 + patches, d): the patches projected (a strided convolution), the
    class token first, the positions added (gpubench.workloads.base.PatchEmbed)."""

    def __init__(self, channels: int, patch: int, d_model: int, tokens: int) -> None:
        super().__init__()
        self.patch = patch
        # registered in the canonical order: the projection's weight and bias, the class token, the positions
        self.weight = nn.Parameter(torch.zeros(d_model, channels, patch, patch))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.cls = nn.Parameter(torch.zeros(d_model))
        self.pos = nn.Parameter(torch.zeros(tokens, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.conv2d(x, self.weight, self.bias, stride=self.patch)
        x = x.flatten(2).transpose(1, 2)  # (N, patches, d), row-major
        cls = self.cls.to(x.dtype).expand(x.shape[0], 1, -1)
        return torch.cat([cls, x], dim=1) + self.pos.to(x.dtype)


# the attention setting: the one kernel F.scaled_dot_product_attention may use (sdpa: its choice);
# torch.nn.attention is imported only for these (it is newer than the oldest torch gpubench takes)
ATTENTION_KERNELS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                     "cudnn": "CUDNN_ATTENTION"}


class Block(nn.Module):
    """A pre-LN transformer block (gpubench.workloads.base.TransformerBlock); attention through
    ``F.scaled_dot_product_attention``: PyTorch's choice of kernel (``attention = "sdpa"``), or
    the one kernel the attention setting names (``sdpa_kernel``: a kernel that cannot run the
    inputs is an error, never a silent fallback)."""

    def __init__(self, d: int, spec: TransformerBlock, attention: str = "sdpa") -> None:
        super().__init__()
        self.heads, self.causal = spec.heads, spec.causal
        self.kernel: SDPBackend | None = None
        self.restrict: Callable[..., AbstractContextManager[None]] | None = None
        if attention in ATTENTION_KERNELS:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            self.kernel, self.restrict = getattr(SDPBackend, ATTENTION_KERNELS[attention]), sdpa_kernel
        self.ln1 = nn.LayerNorm(d, eps=spec.eps)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=spec.eps)
        self.fc1 = nn.Linear(d, spec.mlp_ratio * d)
        self.fc2 = nn.Linear(spec.mlp_ratio * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        # the heads this rank holds: all, or under tp:N its 1/N (gpubench.backends.pytorch.sharding)
        q, k, v = self.qkv(self.ln1(x)).view(n, t, 3, -1, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.kernel is None or self.restrict is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            with self.restrict(self.kernel):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(y.transpose(1, 2).reshape(n, t, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Embedding(nn.Module):
    """(N, T) token ids -> (N, T, d): the tokens' embeddings plus the positions'
    (gpubench.workloads.base.TokenEmbedding)."""

    def __init__(self, vocab: int, d_model: int, tokens: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(vocab, d_model))
        self.pos = nn.Parameter(torch.zeros(tokens, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.embedding(x, self.weight) + self.pos
        if torch.is_autocast_enabled(out.device.type):  # the residual stream in the compute dtype, as in JAX
            out = out.to(torch.get_autocast_dtype(out.device.type))  # and Keras (autocast leaves a lookup alone)
        return out


class LMHead(nn.Module):
    """(N, T, d) -> (N, T, vocab) with the model's token embedding as its weight: ``weight`` is
    the embedding's own parameter, registered in both modules (counted, loaded and optimised
    once; DataParallel's replicas and DDP see the tie)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight: nn.Parameter | None = None  # tied by build_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.weight is not None  # build_model ties it
        return F.linear(x, self.weight)


class FirstToken(nn.Module):
    """(N, T, d) -> (N, d): the class token's features."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0]


def _branch(layers: tuple[Layer, ...], shape: Shape) -> nn.Sequential:
    modules = []
    for layer in layers:
        modules.append(_module(layer, shape, "sdpa"))
        shape = layer.out_shape(shape)
    return nn.Sequential(*modules)


def _module(layer: Layer, in_shape: Shape, attention: str) -> nn.Module:
    if isinstance(layer, Conv2d):
        return nn.Conv2d(in_shape[0], layer.out_channels, layer.kernel_size, layer.stride, layer.padding,
                         bias=layer.bias)
    if isinstance(layer, Linear):
        return nn.Linear(in_shape[0], layer.out_features)
    if isinstance(layer, BatchNorm2d):
        return nn.BatchNorm2d(in_shape[0], eps=layer.eps, momentum=layer.momentum)
    if isinstance(layer, PatchEmbed):
        return Patches(in_shape[0], layer.patch, layer.d_model, layer.out_shape(in_shape)[0])
    if isinstance(layer, TransformerBlock):
        return Block(in_shape[-1], layer, attention)
    if isinstance(layer, LayerNorm):
        return nn.LayerNorm(in_shape[-1], eps=layer.eps)
    if isinstance(layer, ClassToken):
        return FirstToken()
    if isinstance(layer, TokenEmbedding):
        return Embedding(layer.vocab, layer.d_model, in_shape[0])
    if isinstance(layer, TiedLMHead):
        return LMHead()
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


def build_model(spec: WorkloadSpec, weights: list[list[np.ndarray]] | None = None,
                attention: str = "sdpa") -> nn.Sequential:
    """The spec as nn.Sequential, with the canonical weights loaded when given; a transformer's
    blocks compute attention as ``attention`` says (the attention setting).

    Canonical layout is PyTorch's own, so weights load without transposition (a residual
    block's parameters are registered in the canonical order: main branch, then shortcut).
    """
    model = nn.Sequential(*(_module(layer, i, attention) for layer, (i, _) in zip(spec.layers, spec.shapes())))
    embeddings = [m for m in model if isinstance(m, Embedding)]
    for head in (m for m in model if isinstance(m, LMHead)):
        head.weight = embeddings[0].weight  # weight tying (the spec puts the embedding first)
    if weights is not None:
        with torch.no_grad():
            loaded: set[int] = set()  # a tied parameter is loaded with the layer that owns it
            for module, arrays in zip(model, weights):
                params = [p for p in module.parameters() if id(p) not in loaded]
                loaded.update(id(p) for p in params)
                if len(params) != len(arrays):
                    raise ValueError(f"{module}: {len(params)} parameters, {len(arrays)} arrays")
                for p, a in zip(params, arrays):
                    if tuple(p.shape) != a.shape:
                        raise ValueError(f"{module}: parameter shape {tuple(p.shape)} != {a.shape}")
                    p.copy_(torch.from_numpy(a))
    return model
