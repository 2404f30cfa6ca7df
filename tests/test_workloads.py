"""Workload specs: exact parameter counts, analytic FLOPs, seeded weights and data."""

from __future__ import annotations

import numpy as np
import pytest

from gpubench.workloads import get_workload
from gpubench.workloads.base import Conv2d, Flatten, Linear, WorkloadSpec
from gpubench.workloads.data import synthetic_batches


def test_cnn_has_the_mnist_cnn_parameter_count():
    assert get_workload("cnn").spec().params == 1_199_882


@pytest.mark.parametrize("depth, width", [(2, 512), (10, 256), (1, 1)])
def test_mlp_parameter_count_formula(depth, width):
    spec = get_workload("mlp").spec(depth=depth, width=width)
    expected = 784 * width + width + (depth - 1) * (width * width + width) + width * 10 + 10
    assert spec.params == expected


def test_cnn_flops_by_hand():
    spec = get_workload("cnn").spec()
    conv1 = 2 * 1 * 9 * 32 * 26 * 26
    conv2 = 2 * 32 * 9 * 64 * 24 * 24
    fc1 = 2 * 9216 * 128
    fc2 = 2 * 128 * 10
    assert spec.forward_flops_per_sample == conv1 + conv2 + fc1 + fc2
    # the first layer needs no input gradient
    assert spec.train_flops_per_sample == 3 * (conv1 + conv2 + fc1 + fc2) - conv1


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match="needs a flat input"):
        WorkloadSpec("bad", (1, 4, 4), 3, (Linear(3),)).shapes()
    with pytest.raises(ValueError, match="output shape"):
        WorkloadSpec("bad", (1, 4, 4), 3, (Flatten(), Linear(4))).shapes()
    with pytest.raises(ValueError, match="needs a"):
        WorkloadSpec("bad", (16,), 3, (Conv2d(3, 3),)).shapes()


def test_unknown_workload_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown workload 'vgg'; expected one of: cnn, gpt, mlp, resnet18, resnet50, vit"):
        get_workload("vgg")


def test_init_weights_are_seeded_canonical_and_bounded():
    spec = get_workload("cnn").spec()
    a, b, c = spec.init_weights(0), spec.init_weights(0), spec.init_weights(1)
    shapes = [[w.shape for w in layer] for layer in a]
    assert shapes[0] == [(32, 1, 3, 3), (32,)]
    assert shapes[7] == [(128, 9216), (128,)]
    assert all(np.array_equal(x, y) for la, lb in zip(a, b) for x, y in zip(la, lb))
    assert not np.array_equal(a[0][0], c[0][0])
    assert all(w.dtype == np.float32 for layer in a for w in layer)
    bound = 1 / np.sqrt(9216)
    assert np.abs(a[7][0]).max() <= bound and np.abs(a[7][0]).max() > 0.9 * bound


def test_synthetic_batches_are_deterministic_and_class_dependent():
    spec = get_workload("mlp").spec()
    a = synthetic_batches(spec, 16, 4, seed=3)
    b = synthetic_batches(spec, 16, 4, seed=3)
    assert a.x.shape == (4, 16, 1, 28, 28) and a.x.dtype == np.float32
    assert a.y.shape == (4, 16) and a.y.dtype == np.int64
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.x, synthetic_batches(spec, 16, 4, seed=4).x)
    # learnable: a nearest-class-mean classifier fit on batch 0 beats chance on batch 1 by far
    big = synthetic_batches(spec, 256, 2, seed=0)
    x0, y0 = big.x[0].reshape(256, -1), big.y[0]
    means = np.stack([x0[y0 == k].mean(axis=0) for k in range(10)])
    x1 = big.x[1].reshape(256, -1)
    pred = np.argmin(((x1[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert (pred == big.y[1]).mean() > 0.8  # at most ~0.91: 10% of labels are random


def test_the_token_tasks_loss_floor_is_the_entropy_of_its_next_token():
    from gpubench.workloads.data import synthetic_tokens, token_loss_floor

    for vocab in (2, 512, 50257):
        p = np.array([0.9 + 0.1 / vocab] + [0.1 / vocab] * (vocab - 1))
        assert token_loss_floor(vocab) == pytest.approx(-(p * np.log(p)).sum(), rel=1e-12)
        assert token_loss_floor(vocab) < np.log(vocab)  # below a uniform guess: learnable
    # the targets are the inputs shifted by one, and mostly follow a fixed successor of each token
    b = synthetic_tokens(64, 32, 256, 1, seed=0)
    assert np.array_equal(b.x[0][:, 1:], b.y[0][:, :-1])
    x, y = b.x[0].ravel(), b.y[0].ravel()
    successor = {t: np.bincount(y[x == t], minlength=64).argmax() for t in range(64)}
    follows = np.mean([successor[a] == c for a, c in zip(x, y)])
    assert 0.75 < follows < 0.9  # 0.9 x 0.9: the input token and its target both clean, plus chance


def test_a_transformers_parameters_are_counted_from_its_shape():
    vit = get_workload("vit").spec(image=224, patch=16, layers=12, d_model=768, heads=12, classes=1000)
    assert vit.params == 86_567_656  # ViT-B/16
    assert vit.shapes()[0] == ((3, 224, 224), (197, 768))
    gpt = get_workload("gpt").spec(layers=12, d_model=768, heads=12, seq_len=1024, vocab=50257)
    assert gpt.params == 124_439_808 and gpt.output_shape == (1024, 50257)  # GPT-2 small, tied
    with pytest.raises(ValueError, match="heads 5 do not divide d_model 768"):
        get_workload("gpt").spec(layers=1, d_model=768, heads=5, seq_len=8, vocab=10)
