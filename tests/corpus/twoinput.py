"""A model of two inputs, an image and a vector of metadata, as a tuple; it returns a dataclass
holding the logits and an auxiliary output. Written for gpubench's tests."""
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass
class Output:
    logits: torch.Tensor
    embedding: torch.Tensor


class TwoInput(nn.Module):
    def __init__(self, width, extra, classes):
        super().__init__()
        self.image = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                                   nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.meta = nn.Linear(extra, width)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, image, meta):
        z = torch.cat([self.image(image), torch.relu(self.meta(meta))], dim=1)
        return Output(logits=self.head(z), embedding=z)


def two_input(width=16, extra=8, classes=10):
    return TwoInput(width, extra, classes)


def two_input_batches(batch_size, extra=8, classes=10):
    rng = np.random.default_rng(batch_size)
    image = rng.standard_normal((batch_size, 3, 16, 16)).astype(np.float32)
    meta = rng.standard_normal((batch_size, extra)).astype(np.float32)
    return (image, meta), rng.integers(0, classes, batch_size)
