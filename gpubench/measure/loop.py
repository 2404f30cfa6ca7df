"""The measurement loop: cold start, warm-up, timed windows, loss at window boundaries.

Written once against the Trainer interface. The timed loop does only ``step(); mark()``:
no host synchronisation, no loss read, no allocation. The device is synchronised and the
loss read between windows, outside the timed region.

Profiling (``gpubench profile``) passes ``ranges`` (NVTX on CUDA): named ranges around the
warm-up, each window and each step, for Nsight Systems. A normal run passes None and its
timed loop is exactly the plain one.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from gpubench.measure.trainer import Trainer

clock_ns = time.perf_counter_ns  # the one clock for phases (telemetry aligns to it)


@dataclass(frozen=True)
class Phase:
    name: str  # "cold_start", "warmup", "window_0", ...
    start_ns: int
    end_ns: int


@dataclass
class RawMeasurement:
    cold_start_ms: float
    loss_first: float
    step_times_ms: list[float] = field(default_factory=list)
    window_wall_ms: list[float] = field(default_factory=list)
    window_steps: list[int] = field(default_factory=list)  # steps of each measured window
    window_losses: list[float] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    diverged: bool = False
    warmup_steps: int = 0  # warm-up steps run (at least the trainer's min_warmup_steps)
    compile_events_in_windows: int | None = None  # None: the trainer does not compile at runtime

    @property
    def steps_measured(self) -> int:
        return sum(self.window_steps)

    @property
    def losses(self) -> list[float]:
        return [self.loss_first, *self.window_losses]

    @property
    def loss_last(self) -> float:
        return self.losses[-1]


class PhaseObserver(Protocol):
    """Told when a window starts and ends, outside the timed region (telemetry reads the
    GPU's energy counter there)."""

    def on_phase(self, name: str, edge: str) -> None: ...


class Ranges(Protocol):
    """Named ranges for an external profiler (``torch.cuda.nvtx`` on CUDA)."""

    def push(self, name: str) -> None: ...

    def pop(self) -> None: ...


def ranged_step(step: Callable[[], None], ranges: Ranges) -> Callable[[], None]:
    """``step`` inside a range named ``step <n>`` (profiling only)."""
    count = itertools.count()

    def wrapped() -> None:
        ranges.push(f"step {next(count)}")
        step()
        ranges.pop()
    return wrapped


def run_loop(trainer: Trainer, warmup_steps: int, steps: int, windows: int,
             observer: PhaseObserver | None = None, ranges: Ranges | None = None) -> RawMeasurement:
    push, pop = (ranges or NO_RANGES).push, (ranges or NO_RANGES).pop
    push("cold start")
    t0 = clock_ns()
    trainer.step()
    trainer.sync()
    t1 = clock_ns()
    pop()
    raw = RawMeasurement(cold_start_ms=(t1 - t0) / 1e6, loss_first=trainer.read_loss())
    raw.phases.append(Phase("cold_start", t0, t1))
    if not math.isfinite(raw.loss_first):
        raw.diverged = True
        return raw

    step = trainer.step if ranges is None else ranged_step(trainer.step, ranges)
    raw.warmup_steps = max(warmup_steps, trainer.min_warmup_steps)
    push("warmup")
    t0 = clock_ns()
    for _ in range(raw.warmup_steps):
        step()
    trainer.sync()
    raw.phases.append(Phase("warmup", t0, clock_ns()))
    pop()

    compiles = trainer.compile_events()
    for w in range(windows):
        timer = trainer.step_timer(steps)
        mark = timer.mark
        if observer is not None:
            observer.on_phase(f"window_{w}", "start")
        push(f"window {w}")
        t0 = clock_ns()
        mark()
        for _ in range(steps):
            step()
            mark()
        trainer.sync()
        t1 = clock_ns()
        pop()
        if observer is not None:
            observer.on_phase(f"window_{w}", "end")
        raw.phases.append(Phase(f"window_{w}", t0, t1))
        raw.step_times_ms.extend(timer.elapsed_ms())
        raw.window_wall_ms.append((t1 - t0) / 1e6)
        raw.window_steps.append(steps)
        loss = trainer.read_loss()
        raw.window_losses.append(loss)
        if not math.isfinite(loss):
            raw.diverged = True
            break
    if compiles is not None:
        raw.compile_events_in_windows = (trainer.compile_events() or 0) - compiles
    return raw


class NoRanges:
    """Ranges that go nowhere (no profiler attached)."""

    def push(self, name: str) -> None:
        pass

    def pop(self) -> None:
        pass


NO_RANGES = NoRanges()
