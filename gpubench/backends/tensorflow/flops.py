"""FLOPs of one Keras training step as TensorFlow counts them, to check the specs' own counts.

The step (forward, loss, ``tape.gradient`` w.r.t. the trainable variables; no optimizer) is
traced once as a ``tf.function`` at the caller's batch size, and each op of its graph is counted
by TensorFlow's flops statistics registry (``tf.RegisterStatistics(op, "flops")``): the same
per-op formulas the v1 profiler's ``float_operation()`` sums, with a multiply-accumulate as 2
FLOPs. Two corrections, found by comparing with exact counts (see tests/test_tf_flops.py):

* only ops the step's outputs (or its stateful side effects) depend on are counted. TensorFlow's
  Conv2D gradient builds the input gradient of the first convolution too, which nobody uses and
  the function runtime prunes before running; the profiler would count it;
* ``Conv2DBackpropInput``/``Conv2DBackpropFilter`` are counted from their shapes as the forward
  convolution's MACs (2 x out_backprop elements x kernel height x width x input channels). The
  registry multiplies the *input* image's size instead, which overcounts a "valid" convolution
  (28x28 instead of 26x26 positions for MNIST's first conv) and is only approximate for strided
  ones. Depthwise backprops, which the registry does not count, are counted the same way.

Ops inside nested functions or loops (a ``While``/``PartitionedCall`` in the graph: RNNs, nested
``tf.function``s) are invisible to the registry, so such a step gets no count rather than a low one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.util import deprecation

from gpubench.backends.base import Tree

if TYPE_CHECKING:
    import keras

_CONV_GRADS = ("Conv2DBackpropInput", "Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropInput",
               "DepthwiseConv2dNativeBackpropFilter")
_CALLS = ("PartitionedCall", "StatefulPartitionedCall", "While", "StatelessWhile", "If", "StatelessIf", "Case",
          "StatelessCase")


def _conv_grad_flops(op: tf.Operation) -> int:
    """A convolution gradient's FLOPs: the forward convolution's, from out_backprop (input 2,
    [N, H_out, W_out, C_out] in either layout) and the filter [kh, kw, C_in, C_out | multiplier]."""
    out_backprop = op.inputs[2].shape
    kernel = op.inputs[1].shape if op.type.endswith("Input") else op.outputs[0].shape
    if not (out_backprop.is_fully_defined() and kernel.is_fully_defined()):
        raise ValueError(f"{op.type} {op.name} has no static shapes")
    per_output = kernel[0] * kernel[1] * (1 if op.type.startswith("Depthwise") else kernel[2])
    return 2 * out_backprop.num_elements() * per_output


def _live_ops(graph: tf.Graph) -> list[tf.Operation]:
    """The ops the function's outputs and control outputs depend on (what the runtime keeps)."""
    stack = [t.op for t in graph.outputs] + list(graph.control_outputs)
    seen: dict[str, tf.Operation] = {}
    while stack:
        op = stack.pop()
        if op.name not in seen:
            seen[op.name] = op
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
    return list(seen.values())


def keras_train_flops(model: keras.Model, x: Tree[np.ndarray], y: np.ndarray,
                      loss_fn: Callable[[Any, Any], tf.Tensor]) -> tuple[int | None, str]:
    """FLOPs of one training step (forward + loss + backward, no optimizer) per sample, counted by
    TensorFlow, and how they were counted (or why no count could be made). ``x`` is a batch
    (an array, or a dict/tuple of arrays, batch first), ``y`` its targets, ``loss_fn(y_true,
    y_pred)`` a scalar. Never raises: a failure is ``(None, reason)``."""
    try:
        batch = int(np.shape(tf.nest.flatten(x)[0])[0])
        variables = model.trainable_variables
        if not variables:
            return None, "the model has no trainable variables"

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            return [loss] + [g for g in tape.gradient(loss, variables) if g is not None]

        def spec(a: np.ndarray) -> tf.TensorSpec:
            return tf.TensorSpec(np.shape(a), tf.as_dtype(np.asarray(a).dtype))

        graph = step.get_concrete_function(tf.nest.map_structure(spec, x), spec(y)).graph
        if len(graph.outputs) < 2:
            return None, "the loss has no gradient w.r.t. any trainable variable"
        live = _live_ops(graph)
        nested = sorted({op.type for op in live if op.type in _CALLS})
        if nested:
            return None, f"the traced step calls {', '.join(nested)}, whose ops TensorFlow's flops statistics miss"
        total, fixed = 0, 0
        with deprecation.silence():  # the registry's shape helper is a deprecated v1 API
            for op in live:
                if op.type in _CONV_GRADS:
                    flops = _conv_grad_flops(op)
                    fixed += 1
                else:
                    flops = tf_ops.get_stats_for_node_def(graph, op.node_def, "flops").value or 0
                total += int(flops)
        if total <= 0:
            return None, "TensorFlow's flops statistics count no float op in the traced step"
        how = (f"TensorFlow's flops statistics (the v1 profiler's float_ops) over the {len(live)} live ops of the "
               f"traced training step (forward, loss, gradients) at batch {batch}, / {batch}")
        if fixed:
            how += f"; {fixed} convolution gradient ops counted from their shapes as the forward convolution's MACs"
        return round(total / batch), how
    except Exception as e:  # a count is optional: say why there is none
        # a traced error is a traceback: keep its cause (what Keras marks bold, else the inner error's message)
        text = str(e)
        found = (re.search(r"\x1b\[1m(.*?)\x1b\[0m", text, re.S)
                 or re.search(r"^\s*\w+(?:Error|Exception): (.*)$", text, re.M))
        reason = " ".join((found.group(1) if found else text).split())[:200]
        return None, f"could not trace and count the training step: {type(e).__name__}: {reason}"
