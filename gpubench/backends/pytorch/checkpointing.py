"""Activation checkpointing (``checkpointing = "activations"``) for the Sequential models.

The top-level modules (a residual block is one) are cut into about sqrt(n) runs of
consecutive modules, the usual choice (Chen et al. 2016, "Training deep nets with sublinear
memory cost", and what ``torch.utils.checkpoint.checkpoint_sequential`` is for): every run
but the last keeps only its input for the backward pass and recomputes its activations
there (``torch.utils.checkpoint``, non-reentrant). The last run's activations are needed
right away, so it runs normally.

Recomputation gives the same values and gradients: dropout masks are the same (the
checkpoint restores the RNG state) and batch norm in training uses batch statistics. Only
batch norm's running statistics would see a second update, so each recomputation restores
the buffers of its run afterwards.
"""

from __future__ import annotations

import contextlib
import math
from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def segment_bounds(n_modules: int) -> list[tuple[int, int]]:
    """[start, end) of about sqrt(n) runs of consecutive modules, all of one size but the last."""
    size = math.ceil(n_modules / max(1, round(math.sqrt(n_modules))))
    return [(i, min(i + size, n_modules)) for i in range(0, n_modules, size)]


class KeepBuffers:
    """Around a pass that must leave the modules' buffers as they were (a recomputation, a
    counted pass on the host): puts them back on exit. Reusable, as a checkpoint's recompute
    context may be entered once per backward pass."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.buffers = [b for m in modules for b in m.buffers()]
        self.saved: list[torch.Tensor] = []

    def __enter__(self) -> None:
        self.saved = [b.detach().clone() for b in self.buffers]

    def __exit__(self, *exc: object) -> None:
        with torch.no_grad():
            for b, saved in zip(self.buffers, self.saved):
                b.copy_(saved)


def _contexts(modules: list[nn.Module]) -> tuple[contextlib.nullcontext, KeepBuffers]:
    """``context_fn`` of torch.utils.checkpoint: (around the forward, around the recomputation)."""
    return contextlib.nullcontext(), KeepBuffers(modules)


def _run(modules: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for m in modules:
        x = m(x)
    return x


class CheckpointedSequential(nn.Sequential):
    """A Sequential whose forward checkpoints runs of its modules (see the module docstring).
    The same modules in the same order: parameters, state dict and indexing are unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        modules = list(self)
        bounds = segment_bounds(len(modules))
        for start, end in bounds[:-1]:
            run = modules[start:end]
            # torch.compile recomputes through its own partitioner, which applies buffer
            # updates once; it accepts no custom context_fn
            if torch.compiler.is_compiling():
                x = checkpoint(partial(_run, run), x, use_reentrant=False)
            else:
                x = checkpoint(partial(_run, run), x, use_reentrant=False, context_fn=partial(_contexts, run))
        return _run(modules[bounds[-1][0]:], x)

    def describe(self) -> str:
        """How it checkpoints (``runtime.checkpointing``)."""
        bounds = segment_bounds(len(self))
        return (f"activations: {len(bounds) - 1} checkpointed runs of the {len(self)} top-level modules "
                "(torch.utils.checkpoint, non-reentrant), the last run not checkpointed")


def checkpointed(model: nn.Sequential) -> CheckpointedSequential:
    """The same modules (shared, not copied) in a CheckpointedSequential."""
    return CheckpointedSequential(*model)
