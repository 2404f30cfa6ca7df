"""Proof of identity: PyTorch and TensorFlow train the same model on the same data from the
same weights (issue #3). Dropout is removed for the step-by-step comparisons."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("tensorflow")

from gpubench.backends import get_backend  # noqa: E402
from gpubench.backends.pytorch.model import build_model as torch_model  # noqa: E402
from gpubench.backends.tensorflow.layout import nhwc_data  # noqa: E402
from gpubench.backends.tensorflow.model import build_model as keras_model  # noqa: E402
from gpubench.suite import Config  # noqa: E402
from gpubench.workloads import get_workload  # noqa: E402
from gpubench.workloads.data import synthetic_batches  # noqa: E402

WORKLOADS = [("cnn", {}), ("mlp", {}), ("mlp", {"depth": 10, "width": 64})]


def spec_of(name, params):
    return get_workload(name).spec(**params)


@pytest.mark.parametrize("name, params", WORKLOADS)
def test_same_parameter_count_in_both_frameworks(name, params):
    spec = spec_of(name, params)
    assert sum(p.numel() for p in torch_model(spec).parameters()) == spec.params
    assert keras_model(spec).count_params() == spec.params


@pytest.mark.parametrize("name, params", WORKLOADS[:2])
def test_forward_flops_match_tensorflows_own_counter(name, params):
    from tensorflow.python.profiler.model_analyzer import profile
    from tensorflow.python.profiler.option_builder import ProfileOptionBuilder

    spec = spec_of(name, params)
    model = keras_model(spec)
    shape = [1, *model.input_shape[1:]]
    graph = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec(shape, tf.float32)).graph
    options = ProfileOptionBuilder(ProfileOptionBuilder.float_operation()).with_empty_output().build()
    by_type = {}
    node = profile(graph, cmd="op", options=options)
    while node.children:  # the op view is a chain of op types
        node = node.children[0]
        by_type[node.name] = node.float_ops
    assert by_type.get("Conv2D", 0) + by_type["MatMul"] == spec.forward_flops_per_sample


@pytest.mark.parametrize("name, params", WORKLOADS)
def test_same_weights_same_input_same_logits(name, params):
    spec = spec_of(name, params)
    weights = spec.init_weights(3)
    x = synthetic_batches(spec, 32, 1, seed=3).x[0]
    expected = torch_model(spec, weights).eval()(torch.from_numpy(x)).detach().numpy()
    got = keras_model(spec, weights)(nhwc_data(x, 3), training=False).numpy()
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()


def losses(framework, spec, config, batches, steps=8):
    trainer = get_backend(framework).build(spec, config, batches)
    out = []
    for _ in range(steps):
        trainer.step()
        out.append(trainer.read_loss())
    return np.array(out)


@pytest.mark.parametrize("name, params", WORKLOADS[:2])
@pytest.mark.parametrize("optimizer, lr, rtol", [
    ("sgd", 0.01, 1e-5),
    # Keras adds Adam's epsilon before the bias correction of the second moment, PyTorch
    # after it: the updates differ by O(epsilon / sqrt(1 - beta2^t)) in the first steps
    ("adam", 1e-3, 2e-3),
    ("adamw", 1e-3, 2e-3),
])
def test_first_optimizer_steps_give_the_same_losses(name, params, optimizer, lr, rtol):
    spec = spec_of(name, params).without_dropout()
    config = Config(workload=name, batch_size=32, optimizer=optimizer, lr=lr,
                    workload_params=tuple(sorted(params.items())))
    batches = synthetic_batches(spec, 32, 4, seed=0)
    a = losses("torch", spec, config, batches)
    b = losses("tensorflow", spec, config, batches)
    np.testing.assert_allclose(b, a, rtol=rtol)
    assert a[-1] < a[0]  # and it trains


def test_both_trainers_hold_the_same_data():
    spec = spec_of("cnn", {})
    batches = synthetic_batches(spec, 16, 3, seed=1)
    config = Config(workload="cnn", batch_size=16)
    tt = get_backend("torch").build(spec, config, batches)
    kt = get_backend("tensorflow").build(spec, config, batches)
    assert np.array_equal(tt.x.numpy(), batches.x)
    assert np.array_equal(kt.x.numpy(), nhwc_data(batches.x, 3))
    assert np.array_equal(tt.y.numpy(), kt.y.numpy())
