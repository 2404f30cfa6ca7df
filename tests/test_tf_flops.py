"""TensorFlow's own count of a Keras training step's FLOPs, against hand counts and the specs'."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from gpubench.backends.tensorflow.flops import keras_train_flops  # noqa: E402
from gpubench.backends.tensorflow.model import build_model  # noqa: E402
from gpubench.workloads import get_workload  # noqa: E402

Y = np.zeros(2, "int64")  # targets of a batch of 2


def sum_loss(y_true, y_pred):
    return keras.ops.sum(y_pred)


@pytest.mark.parametrize("workload", ["mlp", "cnn", "resnet18"])
def test_builtin_models_match_the_spec_count(workload):
    """The spec counts convolutions and matmuls only (forward, weight and input gradients); TF
    counts bias adds, pooling, batch norm and the loss too, so a little more, never less."""
    spec = get_workload(workload).spec()
    model = build_model(spec)
    x = np.random.default_rng(0).random((2, *model.input_shape[1:]), dtype=np.float32)
    flops, how = keras_train_flops(model, x, Y, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert flops is not None, how
    assert spec.train_flops_per_sample <= flops <= 1.01 * spec.train_flops_per_sample, how
    assert "batch 2, / 2" in how
    assert ("convolution gradient" in how) == (workload != "mlp")


def test_dense_exact():
    """Input(4) -> Dense(3), loss = sum of the logits, batch 2: forward matmul 2*2*4*3 = 48, bias
    add 6, the loss's Sum 6 - 1 = 5, the weight gradient's matmul 48, the bias gradient's
    reduction 6 - 3 = 3 (no input gradient: the input is no variable): 110 / 2 = 55."""
    inp = keras.Input((4,))
    model = keras.Model(inp, keras.layers.Dense(3)(inp))
    assert keras_train_flops(model, np.ones((2, 4), "float32"), Y, sum_loss)[0] == 55
    named = keras.Input((4,), name="a")  # a dict input counts the same
    model = keras.Model({"a": named}, keras.layers.Dense(3)(named))
    assert keras_train_flops(model, {"a": np.ones((2, 4), "float32")}, Y, sum_loss)[0] == 55


def test_conv_gradients_count_as_the_forward_convolution():
    """8x8x3 -> conv 4@3x3 stride 2 "same" (4x4x4 out: 64 * 27 MACs = 3456 FLOPs) -> conv 2@3x3
    "valid" (2x2x2 out: 8 * 36 MACs = 576 FLOPs), no biases. Training: the first conv twice
    (forward, filter gradient: its input gradient is pruned as unused), the second three times:
    2 * 3456 + 3 * 576 = 8640 per sample, plus the loss's Sum over 16 values (15) / 2 -> 8648.
    TensorFlow's registry alone would count the backprops over the 8x8 / 4x4 input image."""
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, strides=2, padding="same", use_bias=False)(inp)
    model = keras.Model(inp, keras.layers.Conv2D(2, 3, use_bias=False)(h))
    flops, how = keras_train_flops(model, np.ones((2, 8, 8, 3), "float32"), Y, sum_loss)
    assert flops == round((2 * 8640 + 15) / 2), how
    assert "3 convolution gradient ops" in how


def test_untraceable_step_gives_a_reason():
    class NumpyInCall(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x) * float(np.asarray(x).sum())  # no numpy of a symbolic tensor

    model = NumpyInCall()
    x = np.ones((2, 4), "float32")
    model(x)  # eagerly fine: builds the weights
    flops, how = keras_train_flops(model, x, Y, sum_loss)
    assert flops is None
    assert how.startswith("could not trace") and "numpy" in how and "\n" not in how


def test_loops_and_variable_free_models_give_no_count():
    inp = keras.Input((5, 3))
    rnn = keras.Model(inp, keras.layers.Dense(2)(keras.layers.LSTM(4)(inp)))
    flops, how = keras_train_flops(rnn, np.ones((2, 5, 3), "float32"), Y, sum_loss)
    assert flops is None and "While" in how
    plain = keras.Sequential([keras.Input((4,)), keras.layers.ReLU()])
    assert keras_train_flops(plain, np.ones((2, 4), "float32"), Y, sum_loss) == (
        None, "the model has no trainable variables")
