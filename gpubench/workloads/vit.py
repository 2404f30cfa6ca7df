"""A ViT-style image classifier: patch embedding with a class token and learned positions,
pre-LN transformer encoder blocks, a final layer norm, the class token's features, a linear
head (Dosovitskiy et al., "An Image is Worth 16x16 Words"). The defaults are a small ViT for
CPUs (CIFAR-size images, 65 tokens); ViT-B/16 on ImageNet-size images is
``image=224 patch=16 layers=12 d_model=768 heads=12 classes=1000``.
"""

from __future__ import annotations

from gpubench.workloads.base import (
    ClassToken,
    LayerNorm,
    Linear,
    Param,
    PatchEmbed,
    TransformerBlock,
    Workload,
    WorkloadSpec,
)


def build_vit(image: int, patch: int, layers: int, d_model: int, heads: int, classes: int) -> WorkloadSpec:
    if image % patch:
        raise ValueError(f"vit: patch {patch} does not divide image {image}")
    if d_model % heads:
        raise ValueError(f"vit: heads {heads} do not divide d_model {d_model}")
    blocks = tuple(TransformerBlock(heads) for _ in range(layers))
    return WorkloadSpec(name="vit", input_shape=(3, image, image), num_classes=classes,
                        layers=(PatchEmbed(patch, d_model), *blocks, LayerNorm(), ClassToken(), Linear(classes)))


VIT = Workload(
    "vit",
    "ViT-style encoder on 3 x `image` x `image`: `patch` x `patch` patches and a class token, `layers` pre-LN "
    "blocks of width `d_model` with `heads` heads (MLP 4 x wider, GELU), `classes` classes",
    build_vit,
    params=(
        Param("image", 32, 1, "image side in pixels (a multiple of patch)"),
        Param("patch", 4, 1, "patch side in pixels"),
        Param("layers", 4, 1, "transformer blocks"),
        Param("d_model", 128, 1, "width of the tokens (a multiple of heads)"),
        Param("heads", 4, 1, "attention heads"),
        Param("classes", 10, 2, "classes"),
    ),
    attention=True,
)
