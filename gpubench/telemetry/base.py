"""Samples and the periodic sampler thread.

Samples are plain dataclasses with units in their field names; a field the device does not
support is None. The sampler is a daemon thread with a stop event and a non-drifting
schedule (the n-th sample is due at start + n * interval, whatever the previous one cost),
so a slow read delays one sample, not all later ones. Timestamps use the measurement loop's
clock, so samples and phases line up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


# the GPM figures of a sample (GpuSample's fields below gpm_period_ns)
GPM_FIELDS = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "tensor_hmma_pct", "dram_bw_pct", "fp32_pct",
              "fp16_pct", "pcie_tx_mib_s", "pcie_rx_mib_s", "nvlink_tx_mib_s", "nvlink_rx_mib_s")


@dataclass
class GpuSample:
    t_ns: int
    index: int
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    energy_mj: int | None = None  # cumulative counter since the driver loaded
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    temp_c: int | None = None
    clock_event_reasons: int | None = None  # NVML clocks event (throttle) reasons bitmask
    pstate: int | None = None
    # NVML's GPU Performance Monitoring (Hopper and later), over the period since the previous
    # sample (gpm_period_ns): shares of the GPU's capacity in %, traffic in MiB/s
    gpm_period_ns: int | None = None
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None  # any tensor-core pipe
    tensor_hmma_pct: float | None = None  # the half-precision (HMMA) tensor pipe
    dram_bw_pct: float | None = None
    fp32_pct: float | None = None
    fp16_pct: float | None = None
    pcie_tx_mib_s: float | None = None
    pcie_rx_mib_s: float | None = None
    nvlink_tx_mib_s: float | None = None
    nvlink_rx_mib_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The sample for a timeline: the GPM figures only where the GPU gave them (a GPU without
        GPM would double the timeline with nulls)."""
        d = asdict(self)
        if self.gpm_period_ns is None:
            for name in ("gpm_period_ns", *GPM_FIELDS):
                d.pop(name, None)
        return d


@dataclass
class HostSample:
    t_ns: int
    cpu_percent: float | None = None  # the worker process tree; 100 = one core busy
    rss_bytes: int | None = None  # the worker process tree
    system_cpu_percent: float | None = None  # the whole machine, 100 = all cores busy
    # every other process on the machine (the machine's CPU less the worker tree's), 100 = one core
    others_cpu_percent: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PeriodicSampler(Generic[T]):
    """Calls ``read()`` every ``interval_s`` on a daemon thread until ``stop()``.

    ``read`` returns a list of samples (one per device); an exception from it is recorded in
    ``errors`` (first few only) and sampling goes on: telemetry must never fail a config.
    """

    MAX_ERRORS = 5

    def __init__(self, name: str, interval_s: float, read: Callable[[], list[T]],
                 sleep: Callable[[float], Any] | None = None) -> None:
        self.name = name
        self.interval_s = interval_s
        self.read = read
        self.samples: list[T] = []
        self.errors: list[str] = []
        self.error_count = 0
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._thread = threading.Thread(target=self._run, name=f"gpubench-{name}-sampler", daemon=True)

    def _take(self) -> None:
        try:
            self.samples.extend(self.read())
        except Exception as e:  # noqa: BLE001 - recorded, never raised
            self.error_count += 1
            if len(self.errors) < self.MAX_ERRORS:
                self.errors.append(f"{type(e).__name__}: {e}")

    def _run(self) -> None:
        start = time.monotonic()
        n = 0
        while not self._stop.is_set():
            self._take()
            n += 1
            delay = start + n * self.interval_s - time.monotonic()
            if delay < 0:  # fell behind: skip the missed slots instead of bursting
                n += int(-delay // self.interval_s) + 1
                delay = start + n * self.interval_s - time.monotonic()
            self._sleep(max(0.0, delay))

    def start(self) -> PeriodicSampler[T]:
        self._thread.start()
        return self

    def stop(self) -> list[T]:
        self._stop.set()
        self._thread.join(timeout=5 + 2 * self.interval_s)
        self._take()  # a last sample at the end
        return self.samples
