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
