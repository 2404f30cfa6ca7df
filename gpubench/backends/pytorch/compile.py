"""How a PyTorch training step is built: eager, torch.compile, or one captured CUDA graph;
and the memory format (channels-last) of the model and its data.

``build_step`` returns the callable the trainer runs for one optimizer step. Everything that
compiles or captures happens in the cold-start step and the warm-up, never in a measured
window: torch.compile compiles forward and backward on the first step; its CUDA-graph modes
record on the next calls (the trainer asks the loop for at least ``CUDAGRAPH_WARMUP_STEPS``
warm-up steps); ``cuda-graph`` warms up, captures and replays in the first step. Every
compilation after the first step is counted (``CompileCounter``) and the loop records how
many fell inside the measured windows.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gpubench.backends.base import Lap, ProfilingUnavailable, Tree, no_lap
from gpubench.backends.pytorch.modes import CUDAGRAPH_MODES, TORCH_COMPILE_MODES
from gpubench.workloads.data import tree_map

if TYPE_CHECKING:
    from gpubench.config import Config


@dataclass(frozen=True)
class StepSource:
    """What a step needs of its trainer, as values and callables (the trainer builds it; nothing
    here reads the trainer's own fields): ``train_step(next_batch, lap)`` runs one optimizer
    update and returns the detached loss; ``next_batch`` gives the trainer's next batch. A CUDA
    graph also needs the model, its optimizer and device, the device-resident pool (``x``,
    ``y``, ``n_batches``, its memory format) and the trainer's position in it (``position()``,
    ``seek(i)``), to gather batches inside the graph and to rewind the warm-up."""

    train_step: Callable[..., torch.Tensor]
    next_batch: Callable[[], tuple[Any, Any]]
    cuda: bool
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    x: Tree[torch.Tensor] | None  # None: the input pipeline's batches
    y: Tree[torch.Tensor] | None
    n_batches: int
    memory_format: torch.memory_format | None
    position: Callable[[], int]
    seek: Callable[[int], None]

CUDAGRAPH_WARMUP_STEPS = 3
GRAPH_EAGER_WARMUP_STEPS = 3  # eager steps on a side stream before capture, as PyTorch's docs do


class CompileCounter:
    """Counts compilations (Dynamo frames, lazy backward compiles, CUDA-graph recordings) with
    Dynamo's compile-start callbacks (nested ones count once)."""

    def __init__(self) -> None:
        self.count = 0
        try:
            from torch._dynamo.callback import on_compile_start
        except ImportError:  # pragma: no cover - torch < 2.5
            self.available = False
            return
        on_compile_start(self._started)
        self.available = True

    def _started(self, *_: object) -> None:
        self.count += 1

    @staticmethod
    def graph_breaks() -> int:
        """Dynamo's graph breaks so far in this process (each break of each compiled frame:
        ``torch._dynamo.utils.counters["graph_break"]``, by reason)."""
        from torch._dynamo.utils import counters

        return int(sum(counters["graph_break"].values()))


def channels_last_pool(x: torch.Tensor) -> torch.Tensor:
    """A (n_batches, B, C, H, W) pool laid out so that every batch ``pool[i]`` is channels-last."""
    return x.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)


def compile_model(model: torch.nn.Module, config: Config) -> tuple[Callable[..., torch.Tensor], dict[str, Any]]:
    """(the module to call for the forward pass, the ``runtime.compile`` description)."""
    if config.compile in ("none", "cuda-graph"):  # cuda-graph captures the eager step (build_step)
        return model, {"setting": config.compile, "how": "eager"}
    if config.compile not in TORCH_COMPILE_MODES:  # the backend's capabilities refuse it before this
        raise ValueError(f"unknown compile setting {config.compile!r} for torch")
    mode = TORCH_COMPILE_MODES[config.compile]
    compiled = torch.compile(model, mode=mode)
    cudagraphs = config.compile in CUDAGRAPH_MODES and config.device.startswith("cuda")
    return compiled, {
        "setting": config.compile, "mode": mode, "backend": "inductor",
        "how": f"torch.compile(model, mode={mode!r}): forward and backward compiled by Inductor"
               + (" and recorded as CUDA graphs" if cudagraphs else "") + "; loss and optimizer step eager",
        "min_warmup_steps": CUDAGRAPH_WARMUP_STEPS if cudagraphs else 0,
    }


def build_step(source: StepSource, config: Config) -> Callable[..., torch.Tensor]:
    """The trainer's step: ``step(lap=no_lap) -> detached loss``."""
    if config.compile == "cuda-graph":
        return CudaGraphStep(source)
    train_step, next_batch = source.train_step, source.next_batch
    if config.compile in CUDAGRAPH_MODES and source.cuda:
        mark = torch.compiler.cudagraph_mark_step_begin  # outputs of the last step may be overwritten now

        def step(lap: Lap = no_lap) -> torch.Tensor:
            mark()
            return train_step(next_batch, lap)
        return step
    return lambda lap=no_lap: train_step(next_batch, lap)


class CudaGraphStep:
    """The whole training step (batch selection, forward, loss, backward, optimizer step) as
    one CUDA graph, replayed once per step with no host work but the launch.

    Inputs are refreshed *inside* the graph: a device-side batch counter selects the next
    batch of the device-resident pool (``index_select``) and advances itself, so the graph
    walks the pool in the same order as the eager trainer. The first call warms up on a side
    stream (eager steps: optimizer state, cuDNN autotuning, allocator), restores the weights,
    buffers (batch norm statistics), the optimizer state and the CUDA RNG to what they were,
    captures, and replays once: every call is exactly one training step, and the losses equal
    the eager trainer's.
    """

    def __init__(self, source: StepSource) -> None:
        self.t = source
        self.graph: torch.cuda.CUDAGraph | None = None
        self.loss: torch.Tensor | None = None
        self.index: torch.Tensor | None = None

    def __call__(self, lap: Lap = no_lap) -> torch.Tensor:
        if lap is not no_lap:
            raise ProfilingUnavailable("cuda-graph runs the whole step as one CUDA graph; its phases cannot be timed "
                                    "apart")
        if self.graph is None:
            self._capture()
        graph, loss = self.graph, self.loss
        assert graph is not None and loss is not None  # _capture sets both
        graph.replay()
        return loss.clone()  # the next replay overwrites the graph's output; every step's loss is kept

    def _gather(self) -> tuple[Any, Any]:
        t, index = self.t, self.index
        assert index is not None  # _capture sets it before the step that gathers is traced
        x = tree_map(lambda a: a.index_select(0, index)[0], t.x)
        y = tree_map(lambda a: a.index_select(0, index)[0], t.y)
        index.add_(1).remainder_(t.n_batches)
        if t.memory_format is not None:  # a copy only if the gather did not keep the pool's channels-last layout
            x = x.contiguous(memory_format=t.memory_format)
        return x, y

    def _capture(self) -> None:
        t = self.t
        start = t.position()
        # on the host: a device copy would count in the config's peak allocated memory
        saved = [v.detach().to("cpu", copy=True) for v in (*t.model.parameters(), *t.model.buffers())]
        rng = torch.cuda.get_rng_state(t.device)
        # the warm-up runs exactly what the graph will (the same gather, shapes and strides), so
        # no lazy initialisation or autotuning is left to happen inside the capture
        self.index = torch.tensor([start], dtype=torch.long, device=t.device)
        side = torch.cuda.Stream(t.device)
        side.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(side), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*capturable=True.*")  # uncaptured warm-up is expected
            for _ in range(GRAPH_EAGER_WARMUP_STEPS):
                t.train_step(self._gather)
        torch.cuda.current_stream(t.device).wait_stream(side)
        with torch.no_grad():  # undo the warm-up: the first replay is the run's first step
            for v, w in zip((*t.model.parameters(), *t.model.buffers()), saved):
                v.copy_(w)  # weights, and batch norm's running statistics
            for state in t.optimizer.state.values():
                for value in state.values():
                    if torch.is_tensor(value):
                        value.zero_()
        torch.cuda.set_rng_state(rng, t.device)
        t.seek(start)
        self.index.fill_(start)
        del saved
        t.optimizer.zero_grad(set_to_none=True)  # backward allocates the grads from the graph's pool
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = t.train_step(self._gather)

    @staticmethod
    def describe() -> dict[str, Any]:
        return {
            "setting": "cuda-graph",
            "how": "one CUDA graph per step: batch selection, forward, loss, backward and optimizer step",
            "inputs": "refreshed inside the graph: a device-side counter selects the next batch of the "
                      "device-resident pool",
            "eager_warmup_steps": GRAPH_EAGER_WARMUP_STEPS,
            "warmup": "eager steps on a side stream before capture, then weights, buffers, optimizer state and "
                      "CUDA RNG restored",
            "optimizer": "capturable",
        }
