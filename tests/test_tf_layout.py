"""Channels-first canonical weights to Keras' channels-last layout (numpy only, no TensorFlow)."""

from __future__ import annotations

import numpy as np

from gpubench.backends.tensorflow.runtime import tf_device
from gpubench.backends.tensorflow.layout import keras_weights, nhwc_data, nhwc_shape
from gpubench.workloads import get_workload
from gpubench.workloads.base import Conv2d, Flatten, Linear, ReLU, WorkloadSpec


def conv_nchw(x, w, b):
    """Reference valid 2-D convolution (cross-correlation), x (C,H,W), w (O,C,k,k)."""
    o, c, k, _ = w.shape
    h, wd = x.shape[1] - k + 1, x.shape[2] - k + 1
    out = np.zeros((o, h, wd))
    for i in range(h):
        for j in range(wd):
            out[:, i, j] = np.tensordot(w, x[:, i:i + k, j:j + k], axes=([1, 2, 3], [0, 1, 2]))
    return out + b[:, None, None]


def conv_nhwc(x, kernel, b):
    """The same convolution computed Keras' way: x (H,W,C), kernel (k,k,C,O)."""
    k = kernel.shape[0]
    h, wd = x.shape[0] - k + 1, x.shape[1] - k + 1
    out = np.zeros((h, wd, kernel.shape[3]))
    for i in range(h):
        for j in range(wd):
            out[i, j] = np.tensordot(x[i:i + k, j:j + k, :], kernel, axes=([0, 1, 2], [0, 1, 2]))
    return out + b


def test_conv_then_flatten_then_dense_gives_the_same_output_in_both_layouts():
    spec = WorkloadSpec("t", (2, 5, 5), 3, (Conv2d(4, 3), ReLU(), Flatten(), Linear(3)))
    weights = spec.init_weights(7)
    kw = keras_weights(spec, weights)
    x = np.random.default_rng(0).standard_normal((2, 5, 5))
    # canonical: NCHW conv, flatten (C, H, W), dense (out, in)
    h = np.maximum(conv_nchw(x, *weights[0]), 0)
    ref = weights[3][0] @ h.reshape(-1) + weights[3][1]
    # keras: NHWC conv, flatten (H, W, C), dense (in, out)
    hk = np.maximum(conv_nhwc(nhwc_data(x[None], 3)[0], *kw[0]), 0)
    got = hk.reshape(-1) @ kw[3][0] + kw[3][1]
    np.testing.assert_allclose(got, ref, rtol=1e-10)
    assert kw[0][0].shape == (3, 3, 2, 4) and kw[3][0].shape == (4 * 3 * 3, 3)


def test_plain_dense_layers_are_transposed():
    spec = get_workload("mlp").spec(depth=2, width=8)
    weights = spec.init_weights(0)
    kw = keras_weights(spec, weights)
    assert np.array_equal(kw[1][0], weights[1][0].T)  # flatten of (1,28,28): the order is the same
    assert np.array_equal(kw[3][0], weights[3][0].T)
    assert [len(a) for a in kw] == [len(a) for a in weights]


def test_nhwc_helpers_and_device_names():
    assert nhwc_shape((1, 28, 28)) == (28, 28, 1) and nhwc_shape((784,)) == (784,)
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    assert nhwc_data(x, 3)[1, 2, 3, 0] == x[1, 0, 2, 3]
    assert tf_device("cpu") == "/CPU:0" and tf_device("cuda") == "/GPU:0" and tf_device("cuda:3") == "/GPU:3"
