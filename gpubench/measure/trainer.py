"""The Trainer interface the measurement loop drives; every framework's backend implements it.

The measurement loop (gpubench.measure.loop) only talks to this interface, so warm-up,
windows, loss reading and statistics are written once for every framework. It lives beside
the loop, below the backends, so the loop never imports a backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpubench.measure.clocks import PhaseClock
    from gpubench.measure.timers import StepTimer


Lap = Callable[[str], None]  # called with a phase name at the end of each phase of a step


def no_lap(phase: str) -> None:
    """The lap of a normal (unsplit) step: nothing."""


class ProfilingUnavailable(Exception):
    """This trainer cannot split its step into phases, or has no profiler (the message says why)."""


class Trainer(ABC):
    """One model + optimizer + device-resident data, ready to take training steps."""

    # steps the trainer needs after the cold-start step before its steps are steady (a
    # compiler recording CUDA graphs): the loop warms up at least this many
    min_warmup_steps: int = 0

    @abstractmethod
    def step(self) -> None:
        """One optimizer step on the next batch. Must not synchronise with the device."""

    @abstractmethod
    def sync(self) -> None:
        """Wait until all queued device work is done."""

    @abstractmethod
    def read_losses(self) -> list[float]:
        """The loss of every step taken since the last read, in order, as Python floats, then
        forgets them. A step keeps its loss where it was computed (no host synchronisation in
        the timed loop); this reads them all at once, outside the timed region (synchronises).
        With several ranks, each is the global batch's loss (a collective: every rank reads at
        the same point)."""

    _last_loss: float = float("nan")

    def read_loss(self) -> float:
        """The loss of the last step (synchronises); the earlier unread steps' losses are dropped."""
        losses = self.read_losses()
        if losses:
            self._last_loss = losses[-1]
        return self._last_loss

    @abstractmethod
    def step_timer(self, n_steps: int) -> StepTimer:
        """A timer for one window of n_steps steps (device events on a GPU)."""

    @abstractmethod
    def memory(self) -> dict[str, int]:
        """Device-side peak memory figures, in bytes (``peak_allocated_bytes`` ...); {} on CPU."""

    def state_bytes(self) -> dict[str, int] | None:
        """The training state resident on this process's device, in bytes, as it holds it (a
        shard of a sharded tensor): ``params_bytes``, ``grads_bytes`` (where gradients persist
        between steps) and ``optimizer_bytes``; None where the trainer does not count it."""
        return None

    def describe(self) -> dict[str, Any]:
        """How the framework was set up for this config (optimizer implementation, autocast
        dtype...), recorded in the result so that the numbers can be interpreted."""
        return {}

    def compile_events(self) -> int | None:
        """Compilations (graph compiles, CUDA-graph recordings) so far; None when the trainer
        does not compile at runtime. The loop checks that none falls in a measured window."""
        return None

    def graph_breaks(self) -> int | None:
        """Graph breaks in the compilations so far (PyTorch's Dynamo: where the compiled step
        falls back to Python); None where the trainer does not count them."""
        return None

    # --- profiling (``gpubench profile``), never used by a normal run --------------------------

    def phased_step(self, lap: Lap) -> None:
        """One training step with ``lap(phase)`` called at the end of each phase (``data``,
        ``forward``, ``backward``, ``optimizer``; or ``forward_backward`` for a framework that
        can only time backward together with a forward). Raises ProfilingUnavailable."""
        raise ProfilingUnavailable(f"{type(self).__name__} does not split its step into phases")

    def phase_clock(self) -> PhaseClock:
        """Times the phases of ``phased_step``, synchronising the device at each lap."""
        from gpubench.measure.clocks import HostPhaseClock

        return HostPhaseClock(self.sync)

    def ranges(self) -> Any:
        """An object with ``push(name)`` / ``pop()`` that marks named ranges for external
        profilers (NVTX on CUDA), or None."""
        return None

    def profile(self, steps: int, out_dir: Path) -> dict[str, Any]:
        """Take ``steps`` steps under the framework's profiler, write its trace under ``out_dir``
        and return ``{"profiler": description, "trace": path, "ops": [OpRow...]}`` (and
        ``"logdir"`` where the profiler keeps its own directory). Raises ProfilingUnavailable."""
        raise ProfilingUnavailable(f"{type(self).__name__} has no profiler")

    # --- distributed trainers (one process per rank) override these ---------------------------

    rank: int = 0
    world_size: int = 1

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (outside the timed region)."""
        return [obj]

    def weights_digest(self) -> str | None:
        """A hash of the model's weights, to check that the ranks agree; None if unsupported."""
        return None

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Release what the trainer holds beyond its process (a process group)."""
