"""The measurement loop: cold start, warm-up, timed windows, the loss of every step read between them.

Written once against the Trainer interface. The timed loop does only ``step(); mark()``:
no host synchronisation, no loss read, no allocation (a step keeps its loss on the device). The
device is synchronised and the window's losses read between windows, outside the timed region.

Profiling (``gpubench profile``) passes ``ranges`` (NVTX on CUDA): named ranges around the
warm-up, each window and each step, for Nsight Systems. A normal run passes None and its
timed loop is exactly the plain one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gpubench.measure.clocks import clock_ns
from gpubench.measure.trainer import Trainer
from gpubench.measure.turns import Turns


@dataclass(frozen=True)
class Phase:
    name: str  # "cold_start", "warmup", "window_0", ...
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of a run to a target: after ``steps`` training steps, ``elapsed_s`` from the
    first step's start to this evaluation's end, the held-out ``loss``, the evaluation's seconds;
    ``energy_j``: the devices' energy over the same span (None where no counter reads it)."""

    steps: int
    elapsed_s: float
    loss: float
    eval_s: float
    energy_j: float | None = None


@dataclass(frozen=True)
class Target:
    """Train until ``evaluate()`` (the held-out loss) is at or below ``loss``, evaluating every
    ``eval_every`` steps, for at most ``max_steps`` steps and ``max_time_s`` seconds."""

    loss: float
    eval_every: int
    max_steps: int
    max_time_s: float
    evaluate: Callable[[], float]
    # the devices' cumulative energy counter in J (None where there is none: a CPU)
    energy_j: Callable[[], float | None] = lambda: None


@dataclass
class RawMeasurement:
    cold_start_ms: float
    losses: list[float]  # the loss of every step from the first: cold start, warm-up, windows
    step_times_ms: list[float] = field(default_factory=list)
    window_wall_ms: list[float] = field(default_factory=list)
    window_steps: list[int] = field(default_factory=list)  # steps of each measured window
    window_losses: list[float] = field(default_factory=list)  # the loss of each window's last step
    phases: list[Phase] = field(default_factory=list)
    diverged: bool = False
    warmup_steps: int = 0  # warm-up steps run (at least the trainer's min_warmup_steps)
    compile_events_in_windows: int | None = None  # None: the trainer does not compile at runtime
    # compile costs (None: the trainer does not compile at runtime, or does not count them):
    # compilations in the first step; compilations after it (recompiles: a guard or a shape
    # that changed, a retrace); graph breaks in the first step's compilation
    compile_events_first: int | None = None
    compile_events_after_first: int | None = None  # the trainer's count once the first step is done
    recompiles: int | None = None
    graph_breaks: int | None = None
    evaluations: list[Evaluation] = field(default_factory=list)  # a target's, in order

    @property
    def steps_measured(self) -> int:
        return sum(self.window_steps)

    @property
    def loss_first(self) -> float:
        return self.losses[0] if self.losses else float("nan")

    @property
    def loss_last(self) -> float:
        return self.losses[-1] if self.losses else float("nan")


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


# a time-bounded window (window_s) still takes at least this many steps: with the usual 3 or
# more windows, 6 or more step times, enough for a distribution-free 95% CI of the median
MIN_WINDOW_STEPS = 2


def window_steps(steps: int, window_s: float, step_ms: float) -> int:
    """Steps per measured window: ``steps``, or with a time bound (``window_s`` > 0) as many as
    fit in ``window_s`` at the estimated ``step_ms``, but at least MIN_WINDOW_STEPS (and never
    more than ``steps``)."""
    if window_s <= 0 or step_ms <= 0:
        return steps
    return max(min(MIN_WINDOW_STEPS, steps), min(steps, int(window_s * 1000.0 / step_ms)))


def run_loop(trainer: Trainer, warmup_steps: int, steps: int, windows: int,
             observer: PhaseObserver | None = None, ranges: Ranges | None = None,
             window_s: float = 0.0, turns: Turns | None = None,
             progress: Callable[[str], None] | None = None) -> RawMeasurement:
    """Cold start, warm-up, then ``windows`` timed windows of ``steps`` steps. With ``window_s``
    (seconds, 0: off) the warm-up stops once it has taken that long (after the trainer's own
    minimum), and every window takes the steps that fit in ``window_s`` at the warm-up's
    measured step time (at least MIN_WINDOW_STEPS): a slow config takes fewer steps, never
    fewer windows, and every window the same number of steps. With ``turns`` (lockstep), the
    worker trains only while it holds the token: it takes it before the cold start and hands
    it over after the warm-up and after every window. ``progress`` is told each phase as it
    begins (outside the timed regions): the worker's heartbeat."""
    turns = turns or Turns()
    try:
        turns.begin()
        return _loop(trainer, warmup_steps, steps, windows, observer, ranges, window_s, turns,
                     progress or (lambda phase: None))
    finally:
        turns.end()


def _loop(trainer: Trainer, warmup_steps: int, steps: int, windows: int, observer: PhaseObserver | None,
          ranges: Ranges | None, window_s: float, turns: Turns, progress: Callable[[str], None]) -> RawMeasurement:
    push, pop = (ranges or NO_RANGES).push, (ranges or NO_RANGES).pop
    raw = _cold_start(trainer, ranges or NO_RANGES, progress)
    if not math.isfinite(raw.loss_first):
        raw.diverged = True
        return raw

    step = trainer.step if ranges is None else ranged_step(trainer.step, ranges)
    wanted = max(warmup_steps, trainer.min_warmup_steps)
    progress(f"warm-up (up to {wanted} steps)")
    push("warmup")
    t0 = clock_ns()
    deadline = t0 + int(window_s * 1e9) if window_s > 0 else None
    for i in range(wanted):
        step()
        raw.warmup_steps = i + 1
        # the host clock alone (no device sync inside the warm-up): on a GPU it runs ahead of the
        # device, so the warm-up may take more steps than the bound, never fewer than needed
        if deadline is not None and raw.warmup_steps >= trainer.min_warmup_steps and clock_ns() >= deadline:
            break
    trainer.sync()
    t1 = clock_ns()
    raw.phases.append(Phase("warmup", t0, t1))
    pop()
    raw.losses += trainer.read_losses()
    step_ms = (t1 - t0) / 1e6 / raw.warmup_steps if raw.warmup_steps else raw.cold_start_ms
    steps = window_steps(steps, window_s, step_ms)

    compiles = trainer.compile_events()
    for w in range(windows):
        turns.swap()
        progress(f"window {w + 1} of {windows} ({steps} steps each)")
        _window(trainer, raw, step, steps, ranges or NO_RANGES, observer)
        loss = raw.loss_last
        if not math.isfinite(loss):
            raw.diverged = True
            break
    if compiles is not None:
        end = trainer.compile_events() or 0
        raw.compile_events_in_windows = end - compiles
        if raw.compile_events_after_first is not None:
            raw.recompiles = end - raw.compile_events_after_first
    return raw


def run_to_target(trainer: Trainer, target: Target, progress: Callable[[str], None] | None = None,
                  turns: Turns | None = None) -> RawMeasurement:
    """Time to quality, as MLPerf Training counts it: the clock starts at the first training step
    (its compilation included) and stops at the end of the evaluation that first reaches the
    target, the evaluations' own time included, the worker's heartbeat (its phase file for the
    runner) not. The steps between evaluations are timed as windows (their step times give the
    rate); a step's loss is read, and the held-out loss evaluated, only between them. Stops at
    the target, at a cap (``max_steps``, or ``max_time_s`` at the next evaluation) or at a
    non-finite loss (``diverged``). With ``turns`` (lockstep) it holds the token from its first
    step to its last evaluation: the two sides of a round train one after the other, and
    neither's clock runs while the other trains."""
    turns = turns or Turns()
    try:
        turns.begin()
        return _to_target(trainer, target, progress)
    finally:
        turns.end()


def _to_target(trainer: Trainer, target: Target, progress: Callable[[str], None] | None) -> RawMeasurement:
    tell = progress or (lambda phase: None)
    energy0 = target.energy_j()  # read just before the clock starts, as its readings just after an evaluation
    raw = _cold_start(trainer, NO_RANGES, tell)
    t0 = raw.phases[0].start_ns  # the clock of the time to target starts with the first step
    told = 0  # ns spent telling the runner what the worker does (its heartbeat file): gpubench's, not training's
    steps, next_eval = 1, target.eval_every
    while math.isfinite(raw.loss_last):
        n = min(next_eval, target.max_steps) - steps  # evaluations after steps eval_every, 2 eval_every, ...
        if n > 0:
            b0 = clock_ns()
            tell(f"training to the target: steps {steps + 1}-{steps + n} (at most {target.max_steps})")
            told += clock_ns() - b0
            _window(trainer, raw, trainer.step, n, NO_RANGES, None)
            steps += n
        e0 = clock_ns()
        loss = target.evaluate()
        e1 = clock_ns()
        elapsed_s = (e1 - t0 - told) / 1e9  # the clock the time to target and the max_time_s cap both read
        energy = target.energy_j()
        told += clock_ns() - e1  # the counter's reading is gpubench's, not training's
        raw.evaluations.append(Evaluation(steps, elapsed_s, loss, (e1 - e0) / 1e9,
                                          None if energy is None or energy0 is None else energy - energy0))
        next_eval += target.eval_every
        if not math.isfinite(loss) or loss <= target.loss or steps >= target.max_steps \
                or elapsed_s >= target.max_time_s:
            break
    raw.diverged = not math.isfinite(raw.loss_last) or any(not math.isfinite(e.loss) for e in raw.evaluations)
    return raw


def _cold_start(trainer: Trainer, ranges: Ranges, progress: Callable[[str], None]) -> RawMeasurement:
    """The first step, synchronised: a measurement that holds its time and loss."""
    progress("cold start (the first step)")
    before, breaks = trainer.compile_events(), trainer.graph_breaks()
    ranges.push("cold start")
    t0 = clock_ns()
    trainer.step()
    trainer.sync()
    t1 = clock_ns()
    ranges.pop()
    raw = RawMeasurement(cold_start_ms=(t1 - t0) / 1e6, losses=trainer.read_losses())
    raw.phases.append(Phase("cold_start", t0, t1))
    after = trainer.compile_events()
    if before is not None and after is not None:
        raw.compile_events_first, raw.compile_events_after_first = after - before, after
        now = trainer.graph_breaks()  # the process's count (Dynamo's): the first step's share of it
        raw.graph_breaks = now - breaks if now is not None and breaks is not None else now
    return raw


def _window(trainer: Trainer, raw: RawMeasurement, step: Callable[[], None], n: int, ranges: Ranges,
            observer: PhaseObserver | None) -> None:
    """One timed window of ``n`` steps, recorded in ``raw``: its step times, wall time, phase and
    the losses of its steps (read after it). The timed region holds only ``step(); mark()``."""
    w = len(raw.window_steps)
    timer = trainer.step_timer(n)
    mark = timer.mark
    if observer is not None:
        observer.on_phase(f"window_{w}", "start")
    ranges.push(f"window {w}")
    t0 = clock_ns()
    mark()
    for _ in range(n):
        step()
        mark()
    trainer.sync()
    t1 = clock_ns()
    # read now: a timer that reads its clock when asked (WindowTimer) must not count what
    # follows the synchronisation (the range's pop, an observer's energy reading)
    raw.step_times_ms.extend(timer.elapsed_ms())
    ranges.pop()
    if observer is not None:
        observer.on_phase(f"window_{w}", "end")
    raw.phases.append(Phase(f"window_{w}", t0, t1))
    raw.window_wall_ms.append((t1 - t0) / 1e6)
    raw.window_steps.append(n)
    raw.losses += trainer.read_losses()
    raw.window_losses.append(raw.loss_last)


class NoRanges:
    """Ranges that go nowhere (no profiler attached)."""

    def push(self, name: str) -> None:
        pass

    def pop(self) -> None:
        pass


NO_RANGES = NoRanges()
