"""The clocks of a measurement: one monotonic host clock every phase and telemetry sample is
on, and the phase clock of the where-time-goes breakdown (a leaf module: the Trainer interface
and the breakdown both use it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

clock_ns = time.perf_counter_ns  # the one clock for phases (telemetry aligns to it)


class PhaseClock(Protocol):
    timing: str  # "cuda_events" or "host_clock", recorded with the breakdown

    def start(self) -> None:
        """Synchronise the device and start timing."""

    def lap(self) -> float:
        """Synchronise the device; milliseconds since ``start`` or the previous lap."""


class HostPhaseClock:
    """perf_counter around a device synchronisation."""

    timing = "host_clock"

    def __init__(self, sync: Callable[[], None]) -> None:
        self._sync = sync
        self._t = 0

    def start(self) -> None:
        self._sync()
        self._t = clock_ns()

    def lap(self) -> float:
        self._sync()
        t = clock_ns()
        ms, self._t = (t - self._t) / 1e6, t
        return ms
