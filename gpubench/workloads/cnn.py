"""The classic MNIST CNN (as in the Keras and PyTorch MNIST examples): 1,199,882 parameters."""

from __future__ import annotations

from gpubench.workloads.base import Conv2d, Dropout, Flatten, Linear, MaxPool2d, ReLU, Workload, WorkloadSpec


def build_cnn() -> WorkloadSpec:
    return WorkloadSpec(
        name="cnn",
        input_shape=(1, 28, 28),
        num_classes=10,
        layers=(
            Conv2d(32, 3), ReLU(),
            Conv2d(64, 3), ReLU(),
            MaxPool2d(2), Dropout(0.25), Flatten(),
            Linear(128), ReLU(), Dropout(0.5),
            Linear(10),
        ),
    )


CNN = Workload("cnn", "MNIST CNN: conv32-conv64-maxpool-dropout-fc128-fc10 on 1x28x28", build_cnn)
