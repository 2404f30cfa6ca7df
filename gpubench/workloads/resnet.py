"""Residual networks: ResNet-50 (ImageNet-size) and the CIFAR-size ResNet-18.

Both as commonly defined: convolutions without bias, each followed by batch norm; a block's
projection shortcut (1x1 convolution + batch norm) where it changes the resolution or the
width, the identity otherwise.
"""

from __future__ import annotations

from gpubench.workloads.base import (
    BatchNorm2d,
    Conv2d,
    GlobalAvgPool,
    Layer,
    Linear,
    MaxPool2d,
    ReLU,
    Residual,
    Workload,
    WorkloadSpec,
)


def _conv_bn(out_channels: int, kernel: int, stride: int = 1) -> tuple[Layer, ...]:
    return (Conv2d(out_channels, kernel, stride, kernel // 2, bias=False), BatchNorm2d())


def _shortcut(in_channels: int, out_channels: int, stride: int) -> tuple[Layer, ...]:
    return _conv_bn(out_channels, 1, stride) if stride != 1 or in_channels != out_channels else ()


def basic_block(in_channels: int, channels: int, stride: int) -> Residual:
    """Two 3x3 convolutions (the first one strided)."""
    return Residual(main=(*_conv_bn(channels, 3, stride), ReLU(), *_conv_bn(channels, 3)),
                    shortcut=_shortcut(in_channels, channels, stride))


def bottleneck(in_channels: int, width: int, stride: int) -> Residual:
    """1x1 down to ``width``, 3x3 (strided: ResNet v1.5, as torchvision), 1x1 up to 4 x width."""
    return Residual(main=(*_conv_bn(width, 1), ReLU(), *_conv_bn(width, 3, stride), ReLU(), *_conv_bn(4 * width, 1)),
                    shortcut=_shortcut(in_channels, 4 * width, stride))


def _stages(block, expansion: int, in_channels: int, blocks: tuple[int, ...]) -> list[Layer]:
    """Stages of blocks at widths 64, 128, 256, 512; every stage after the first halves the
    resolution in its first block."""
    layers: list[Layer] = []
    for i, n in enumerate(blocks):
        width = 64 << i
        for j in range(n):
            layers.append(block(in_channels, width, 2 if i > 0 and j == 0 else 1))
            in_channels = width * expansion
    return layers


def build_resnet50() -> WorkloadSpec:
    stem = [*_conv_bn(64, 7, 2), ReLU(), MaxPool2d(3, 2, 1)]  # 224 -> 112 -> 56
    return WorkloadSpec(name="resnet50", input_shape=(3, 224, 224), num_classes=1000,
                        layers=(*stem, *_stages(bottleneck, 4, 64, (3, 4, 6, 3)), GlobalAvgPool(), Linear(1000)))


def build_resnet18() -> WorkloadSpec:
    stem = [*_conv_bn(64, 3), ReLU()]  # CIFAR: 3x3 stride 1, no max-pool
    return WorkloadSpec(name="resnet18", input_shape=(3, 32, 32), num_classes=10,
                        layers=(*stem, *_stages(basic_block, 1, 64, (2, 2, 2, 2)), GlobalAvgPool(), Linear(10)))


RESNET50 = Workload("resnet50", "ResNet-50 v1.5 (torchvision layout) on 3x224x224, 1000 classes", build_resnet50)
RESNET18 = Workload("resnet18", "CIFAR ResNet-18 on 3x32x32, 10 classes: 3x3 stem, no max-pool, basic blocks "
                                "[2,2,2,2]", build_resnet18)
