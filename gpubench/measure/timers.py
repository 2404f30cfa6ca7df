"""Step timers: host clock for synchronous devices; backends add device-event timers."""

from __future__ import annotations

import time
from typing import Protocol


class StepTimer(Protocol):
    """Call ``mark()`` once before the first step and once after every step of a window;
    ``elapsed_ms()`` (after the device is synchronised) gives one duration per step."""

    def mark(self) -> None: ...

    def elapsed_ms(self) -> list[float]: ...


class HostStepTimer:
    """perf_counter_ns marks: right for devices whose steps finish before step() returns
    (PyTorch on CPU)."""

    def __init__(self, n_steps: int) -> None:
        self._marks: list[int] = []
        self.mark = self._mark  # bound once: the timed loop does one attribute call per step

    def _mark(self) -> None:
        self._marks.append(time.perf_counter_ns())

    def elapsed_ms(self) -> list[float]:
        m = self._marks
        return [(b - a) / 1e6 for a, b in zip(m, m[1:])]


class WindowTimer:
    """For a framework whose steps run asynchronously and that has no device events to record
    between them (TensorFlow on a GPU; JAX everywhere): the window is timed on the host clock,
    synchronised at its end, and yields one value, the window's mean step time
    (``runtime.step_timing = window_mean``)."""

    def __init__(self, n_steps: int) -> None:
        self.n_steps = n_steps
        self._start: int | None = None
        self._marks = 0

    def mark(self) -> None:
        if self._start is None:
            self._start = time.perf_counter_ns()
        self._marks += 1

    def elapsed_ms(self) -> list[float]:  # called after the loop synchronised the device
        steps = self._marks - 1
        if self._start is None or steps < 1:
            return []
        return [(time.perf_counter_ns() - self._start) / 1e6 / steps]
