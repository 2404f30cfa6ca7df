"""Host telemetry with psutil: the worker process tree's CPU and RSS, the whole machine's CPU,
and what every other process used of it (contention)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from gpubench.measure.clocks import clock_ns
from gpubench.telemetry.base import HostSample

MIN_CPU_INTERVAL_S = 0.05  # a shorter interval has no meaningful CPU % (10 ms ticks)
MAX_READ_SHARE = 0.25  # a reading that took longer than this share of its interval is dropped


@dataclass(frozen=True)
class Totals:
    t_ns: int
    tree_cpu_s: float  # user + system seconds of the worker's process tree
    machine_busy_s: float  # the machine's busy CPU seconds (every core)
    machine_total_s: float
    cores: int


def _busy_total(t: object) -> tuple[float, float]:
    """(busy, total) CPU seconds of the machine from ``psutil.cpu_times()``: total without the
    guest times (Linux counts them in user and nice already), busy without idle and iowait, as
    ``psutil.cpu_percent`` reckons them."""
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # type: ignore[call-overload]
    return total - t.idle - getattr(t, "iowait", 0.0), total  # type: ignore[attr-defined]


class HostReader:
    """The process tree's CPU % is the change of its CPU time (user + system, from one
    ``/proc`` snapshot per process) over the wall time between two readings, both timed
    around the snapshot. psutil's own ``Process.cpu_percent`` reads its clock *before* the
    snapshot, so when the sampler thread waits for the GIL in between (the training thread
    holds it, e.g. while TensorFlow traces), the CPU time of the wait lands on a tiny interval
    (1470% was seen on 2 cores); here a reading that took more than ``MAX_READ_SHARE`` of its
    interval, or an interval under ``MIN_CPU_INTERVAL_S``, has no CPU figures (None). A
    process is counted from its second reading on (a new DataLoader worker first primes).
    The machine's CPU % is the busy share of the change of ``psutil.cpu_times()`` (``/proc/stat``)
    between this reader's own snapshots, taken with the tree's (``psutil.cpu_percent`` keeps
    one interval for the whole process: a second reader, or any other caller, would cut it
    short). What the other processes used (``others_cpu_percent``, 100 = one core) is the
    machine's CPU, in cores, less the tree's over the same reading: the tree holds the worker,
    its data-loader workers and, for a distributed config, the launcher with every rank, so
    none of those counts as another process.

    Finding the process tree's children scans every process on the machine (2.7 ms of CPU
    with 80 processes on the 2-vCPU development VM, against 0.43 ms for a whole reading of a
    3-process tree: ``benchmarks/host_reader_cost.py``), so the tree is refreshed at most
    every ``tree_refresh_s``; between refreshes only the known processes are read.
    """

    def __init__(self, pid: int | None = None, tree_refresh_s: float = 1.0,
                 clock: Callable[[], int] = clock_ns) -> None:
        self.root = psutil.Process(pid or os.getpid())
        self.cores = psutil.cpu_count() or 1
        self.clock = clock
        self.tree_refresh_ns = int(tree_refresh_s * 1e9)
        self._members: list[psutil.Process] = []
        self._refreshed_ns: int | None = None
        self._last_cpu_s: dict[int, float] = {}  # per pid: user + system seconds at the last reading
        self._last_ns: int | None = None
        self._last_machine: tuple[float, float] | None = None  # busy and total CPU seconds of the machine
        self._lock = threading.Lock()  # the sampler thread and the training thread (totals) share the tree
        self._snapshot()  # primes the CPU-time counters (and lists the tree)

    def _tree(self, refresh: bool = True) -> list[psutil.Process]:
        with self._lock:
            now = self.clock()
            if not refresh or (self._refreshed_ns is not None and now - self._refreshed_ns < self.tree_refresh_ns):
                return list(self._members)
            self._refreshed_ns = now
            try:
                self._members = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                self._members = [self.root]
            return list(self._members)

    def totals(self, refresh: bool = True) -> Totals:
        """The tree's and the machine's CPU seconds now (``Totals``), for a figure over an exact
        span (contention.over_span: the measured windows, first start to last end);
        ``refresh=False`` reads the processes known already (no scan of the machine's)."""
        cpu_s, _ = self._read_tree(refresh, rss=False)
        busy, total = _busy_total(psutil.cpu_times())
        return Totals(self.clock(), sum(cpu_s.values()), busy, total, self.cores)

    def _read_tree(self, refresh: bool, rss: bool) -> tuple[dict[int, float], int]:
        """(per pid of the tree: user + system seconds, the tree's RSS bytes, or 0 without ``rss``);
        a process that ended meanwhile is left out."""
        cpu_s: dict[int, float] = {}
        total_rss = 0
        for p in self._tree(refresh):
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    total_rss += p.memory_info().rss if rss else 0
            except psutil.Error:
                continue
            cpu_s[p.pid] = t.user + t.system
        return cpu_s, total_rss

    def _snapshot(self) -> tuple[float | None, float | None, int, int, int]:
        """(CPU % of the tree since the last snapshot or None, the machine's CPU % over the same
        interval or None, RSS bytes, start ns, end ns)."""
        start = self.clock()
        machine = _busy_total(psutil.cpu_times())
        cpu_s, rss = self._read_tree(refresh=True, rss=True)
        end = self.clock()
        percent = system = None
        if self._last_ns is not None and self._last_machine is not None:
            interval = end - self._last_ns
            if interval >= MIN_CPU_INTERVAL_S * 1e9 and (end - start) <= MAX_READ_SHARE * interval:
                used = sum(v - self._last_cpu_s[pid] for pid, v in cpu_s.items() if pid in self._last_cpu_s)
                percent = 100.0 * used / (interval / 1e9)
                busy, total = machine[0] - self._last_machine[0], machine[1] - self._last_machine[1]
                system = min(100.0, max(0.0, 100.0 * busy / total)) if total > 0 else None
        self._last_cpu_s, self._last_ns, self._last_machine = cpu_s, end, machine
        return percent, system, rss, start, end

    def read(self) -> list[HostSample]:
        # no machine figure where the tree has none (over too short an interval it means as little), nor
        # where /proc/stat did not move (a tick is 10 ms); both are counted in 10 ms ticks: a small negative
        # difference is rounding
        percent, system, rss, _, end = self._snapshot()
        others = None if percent is None or system is None else max(0.0, system * self.cores - percent)
        return [HostSample(t_ns=end, cpu_percent=percent, rss_bytes=rss, system_cpu_percent=system,
                           others_cpu_percent=others)]
