"""Host telemetry with psutil: the worker process tree's CPU and RSS, and the whole machine's CPU."""

from __future__ import annotations

import os
from collections.abc import Callable

import psutil

from gpubench.telemetry.base import HostSample, now_ns

MIN_CPU_INTERVAL_S = 0.05  # a shorter interval has no meaningful CPU % (10 ms ticks)
MAX_READ_SHARE = 0.25  # a reading that took longer than this share of its interval is dropped


class HostReader:
    """The process tree's CPU % is the change of its CPU time (user + system, from one
    ``/proc`` snapshot per process) over the wall time between two readings, both timed
    around the snapshot. psutil's own ``Process.cpu_percent`` reads its clock *before* the
    snapshot, so when the sampler thread waits for the GIL in between (the training thread
    holds it, e.g. while TensorFlow traces), the CPU time of the wait lands on a tiny interval
    (1470% was seen on 2 cores); here a reading that took more than ``MAX_READ_SHARE`` of its
    interval, or an interval under ``MIN_CPU_INTERVAL_S``, has no CPU figures (None). A
    process is counted from its second reading on (a new DataLoader worker first primes).
    The machine's CPU % comes from ``psutil.cpu_percent``, a ratio of two snapshots of
    ``/proc/stat`` that needs no clock.

    Finding the process tree's children scans every process on the machine (2.7 ms of CPU
    with 80 processes on the 2-vCPU development VM, against 0.43 ms for a whole reading of a
    3-process tree: ``benchmarks/host_reader_cost.py``), so the tree is refreshed at most
    every ``tree_refresh_s``; between refreshes only the known processes are read.
    """

    def __init__(self, pid: int | None = None, tree_refresh_s: float = 1.0,
                 clock: Callable[[], int] = now_ns) -> None:
        self.root = psutil.Process(pid or os.getpid())
        self.clock = clock
        self.tree_refresh_ns = int(tree_refresh_s * 1e9)
        self._members: list[psutil.Process] = []
        self._refreshed_ns: int | None = None
        self._last_cpu_s: dict[int, float] = {}  # per pid: user + system seconds at the last reading
        self._last_ns: int | None = None
        psutil.cpu_percent(None)
        self._snapshot()  # primes the CPU-time counters (and lists the tree)

    def _tree(self) -> list[psutil.Process]:
        now = self.clock()
        if self._refreshed_ns is not None and now - self._refreshed_ns < self.tree_refresh_ns:
            return self._members
        self._refreshed_ns = now
        try:
            self._members = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            self._members = [self.root]
        return self._members

    def _snapshot(self) -> tuple[float | None, int, int, int]:
        """(CPU % of the tree since the last snapshot or None, RSS bytes, start ns, end ns)."""
        start = self.clock()
        cpu_s: dict[int, float] = {}
        rss = 0
        for p in self._tree():
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    rss += p.memory_info().rss
            except psutil.Error:
                continue
            cpu_s[p.pid] = t.user + t.system
        end = self.clock()
        percent = None
        if self._last_ns is not None:
            interval = end - self._last_ns
            if interval >= MIN_CPU_INTERVAL_S * 1e9 and (end - start) <= MAX_READ_SHARE * interval:
                used = sum(v - self._last_cpu_s[pid] for pid, v in cpu_s.items() if pid in self._last_cpu_s)
                percent = 100.0 * used / (interval / 1e9)
        self._last_cpu_s, self._last_ns = cpu_s, end
        return percent, rss, start, end

    def read(self) -> list[HostSample]:
        percent, rss, _, end = self._snapshot()
        system = psutil.cpu_percent(None)
        if percent is None:  # the machine's figure over the same too-short interval means as little
            system = None
        return [HostSample(t_ns=end, cpu_percent=percent, rss_bytes=rss, system_cpu_percent=system)]
