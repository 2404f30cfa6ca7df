"""Canonical (PyTorch-layout, channels-first) weights and data to Keras' channels-last layout.

Pure numpy, so that the conversion is tested without TensorFlow:
- conv kernels (out, in, kh, kw) -> (kh, kw, in, out);
- dense kernels (out, in) -> (in, out);
- a dense layer fed by a flatten of a (C, H, W) tensor: Keras flattens NHWC in (H, W, C)
  order, the canonical flatten is (C, H, W), so the rows of its kernel are permuted to match;
- batch norm (gamma, beta) -> Keras' (gamma, beta, moving_mean, moving_variance), with the
  running statistics at PyTorch's initial values (0 and 1);
- data (..., C, H, W) -> (..., H, W, C);
- a patch or token embedding, a transformer block and a layer norm take the canonical arrays
  as they are (their Keras layers compute in that layout).
"""

from __future__ import annotations

import numpy as np

from gpubench.workloads.base import (
    BatchNorm2d,
    Conv2d,
    Flatten,
    LayerNorm,
    Linear,
    PatchEmbed,
    TokenEmbedding,
    TransformerBlock,
    WorkloadSpec,
)


def nhwc_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[1], shape[2], shape[0]) if len(shape) == 3 else shape


def nhwc_data(x: np.ndarray, sample_ndim: int) -> np.ndarray:
    """Move the channel axis last for image samples (x: (..., C, H, W))."""
    if sample_ndim != 3:
        return x
    n = x.ndim
    return np.ascontiguousarray(np.moveaxis(x, n - 3, n - 1))


def keras_weights(spec: WorkloadSpec, weights: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """Per leaf layer (``spec.leaves()``: a residual block's layers one by one), the canonical
    arrays converted to what the Keras layer's set_weights takes."""
    out: list[list[np.ndarray]] = []
    flattened_from: tuple[int, ...] | None = None  # (C, H, W) of the last flatten, until a dense consumes it
    for leaves, arrays in zip(spec.leaves_by_layer(), weights):
        arrays = list(arrays)
        for leaf in leaves:
            layer, in_shape, n = leaf.layer, leaf.in_shape, len(leaf.param_shapes())
            mine, arrays = arrays[:n], arrays[n:]
            if isinstance(layer, Flatten):
                flattened_from = in_shape if len(in_shape) == 3 else None
                out.append([])
            elif isinstance(layer, Conv2d):
                w, *bias = mine
                out.append([np.ascontiguousarray(w.transpose(2, 3, 1, 0)), *bias])
                flattened_from = None
            elif isinstance(layer, Linear):
                w, b = mine
                if flattened_from is not None:
                    c, h, wd = flattened_from
                    kernel = w.reshape(w.shape[0], c, h, wd).transpose(2, 3, 1, 0).reshape(h * wd * c, w.shape[0])
                else:
                    kernel = w.T
                out.append([np.ascontiguousarray(kernel), b])
                flattened_from = None
            elif isinstance(layer, (PatchEmbed, TransformerBlock, LayerNorm, TokenEmbedding)):  # canonical layout
                out.append(list(mine))
            elif isinstance(layer, BatchNorm2d):
                gamma, beta = mine
                out.append([gamma, beta, np.zeros_like(gamma), np.ones_like(gamma)])
            else:
                out.append([])
    return out
