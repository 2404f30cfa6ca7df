"""PyTorch's compile settings and what they need, without importing torch: the backend's rules
(which must not import the framework) and the step builder share them."""

from __future__ import annotations

# compile setting -> torch.compile mode
TORCH_COMPILE_MODES = {"torch-compile": "default", "torch-compile-reduce-overhead": "reduce-overhead",
                       "torch-compile-max-autotune": "max-autotune"}
# modes in which Inductor records CUDA graphs (CUDA devices only): the first call runs eagerly,
# the second records, later calls replay
CUDAGRAPH_MODES = ("torch-compile-reduce-overhead", "torch-compile-max-autotune")
# the optimizers whose state, zeroed, is exactly their state before the first step (Adam/AdamW:
# step 0 and zero moments; SGD: a zero momentum buffer gives the first step's buf = grad)
GRAPH_RESETTABLE_OPTIMIZERS = ("adam", "adamw", "sgd")
