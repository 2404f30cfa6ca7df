"""A fully connected net on 28x28 input, with settable depth and width."""

from __future__ import annotations

from gpubench.workloads.base import Flatten, Layer, Linear, Param, ReLU, Workload, WorkloadSpec


def build_mlp(depth: int, width: int) -> WorkloadSpec:
    layers: list[Layer] = [Flatten()]
    for _ in range(depth):
        layers += [Linear(width), ReLU()]
    layers.append(Linear(10))
    return WorkloadSpec(name="mlp", input_shape=(1, 28, 28), num_classes=10, layers=tuple(layers))


MLP = Workload(
    "mlp",
    "fully connected net on 1x28x28: `depth` hidden layers of `width` units, ReLU",
    build_mlp,
    params=(
        Param("depth", 2, 1, "number of hidden layers"),
        Param("width", 512, 1, "units per hidden layer"),
    ),
)
