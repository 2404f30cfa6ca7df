"""The model code of an example project: plain PyTorch and Keras, nothing of gpubench imported.

gpubench builds these models by name (``workload = "mymodels:small_convnet"``), passes the
suite's ``args.<name>`` as keyword arguments, and trains them on its synthetic data or on the
batches ``batches`` returns.
"""

from __future__ import annotations

import numpy as np


def small_convnet(width: int = 16, classes: int = 10):
    """A small image classifier with layers gpubench's own workloads lack (GroupNorm, SiLU)."""
    from torch import nn

    class SmallConvNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, width, 3, padding=1), nn.GroupNorm(4, width), nn.SiLU(),
                nn.Conv2d(width, width, 3, padding=1), nn.GroupNorm(4, width), nn.SiLU())
            self.head = nn.Linear(width, classes)

        def forward(self, x):
            x = self.features(x)
            return self.head(x.mean(dim=(2, 3)))

    return SmallConvNet()


def tagger(vocab: int = 100, width: int = 32, classes: int = 5):
    """A model that takes two inputs by name (token ids and a float feature vector) and reads
    the tokens with an LSTM."""
    import torch
    from torch import nn

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.lstm = nn.LSTM(width, width, batch_first=True)
            self.head = nn.Linear(width + 4, classes)

        def forward(self, tokens, extra):
            out, _ = self.lstm(self.embed(tokens))
            return self.head(torch.cat([out[:, -1], extra], dim=1))

    return Tagger()


def tagger_batches(batch_size: int):
    """A batch for ``tagger``: inputs as a dict of the forward's arguments, targets the classes."""
    rng = np.random.default_rng(batch_size)
    inputs = {"tokens": rng.integers(0, 100, (batch_size, 12)),
              "extra": rng.standard_normal((batch_size, 4)).astype(np.float32)}
    return inputs, rng.integers(0, 5, batch_size)


def my_loss(outputs, targets):
    """A loss of your own, ``(outputs, targets) -> scalar``: cross-entropy with label smoothing."""
    from torch.nn import functional as F

    return F.cross_entropy(outputs.float(), targets, label_smoothing=0.1)


def keras_convnet(width: int = 16, classes: int = 10):
    """The same idea in Keras: a functional model (it declares its input, channels last)."""
    import keras

    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(width, 3, padding="same")(inputs)
    x = keras.layers.GroupNormalization(groups=4)(x)
    x = keras.layers.Activation("silu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(classes)(x))


def flax_convnet(width: int = 16, classes: int = 10):
    """The same idea in JAX: a Flax module (channels last), with batch norm, whose running
    statistics gpubench carries as the module's batch_stats; ``train`` tells it which pass."""
    import flax.linen as nn

    class ConvNet(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            x = nn.Conv(width, (3, 3))(x)
            x = nn.BatchNorm(use_running_average=not train)(x)
            x = nn.silu(x)
            return nn.Dense(classes)(x.mean(axis=(1, 2)))

    return ConvNet()
