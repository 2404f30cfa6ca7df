"""scikit-learn's bundled digits (1,797 8x8 images, no download) as a user hands them to gpubench:
a training split and a held-out split, in the forms users have (a PyTorch TensorDataset, NumPy
arrays, a tf.data.Dataset), and a small MLP to train on them.

The split: 80% for training, 20% held out, by a fixed shuffle; pixels scaled to [0, 1].
"""

from __future__ import annotations

import numpy as np


def _splits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # (1797, 64)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    cut = int(0.8 * len(y))  # 1437 to train on, 360 held out
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


# NumPy arrays (inputs, targets): every framework takes them
def train_arrays():
    return _splits()[0]


def held_out_arrays():
    return _splits()[1]


# PyTorch TensorDatasets, as a PyTorch user has them
def train_dataset():
    import torch
    from torch.utils.data import TensorDataset

    x, y = _splits()[0]
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def held_out_dataset():
    import torch
    from torch.utils.data import TensorDataset

    x, y = _splits()[1]
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


# tf.data, as a TensorFlow user has it (batched: gpubench takes its samples and batches them itself)
def train_tf():
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(_splits()[0]).batch(64)


def held_out_tf():
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(_splits()[1]).batch(64)


def mlp():
    """64 pixels -> 128 -> 10 classes."""
    from torch import nn

    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
