"""Host telemetry with psutil: the worker process tree's CPU and RSS, and the whole machine's CPU."""

from __future__ import annotations

import os

import psutil

from gpubench.telemetry.base import HostSample, now_ns


MIN_CPU_INTERVAL_S = 0.05


class HostReader:
    """CPU percent needs two readings: the constructor primes every counter, and a reading
    less than ``MIN_CPU_INTERVAL_S`` after the previous one (the first sample, taken as the
    sampler starts) has no CPU figures (None): the kernel counts CPU time in 10 ms ticks, so
    over a few ms it would read 0%, which is not what the process did.

    Finding the process tree's children scans every process on the machine (about 0.8 ms on
    the 2-vCPU development VM, measured), so the tree is refreshed at most every
    ``tree_refresh_s``; between refreshes the known processes are read (about 40 us each).
    A child that starts between refreshes (a DataLoader worker) is picked up at the next one.
    """

    def __init__(self, pid: int | None = None, tree_refresh_s: float = 1.0) -> None:
        self.root = psutil.Process(pid or os.getpid())
        self._procs: dict[int, psutil.Process] = {}
        self.tree_refresh_ns = int(tree_refresh_s * 1e9)
        self._members: list[psutil.Process] = []
        self._refreshed_ns: int | None = None
        psutil.cpu_percent(None)
        self._tree()
        self._cpu_read_ns = now_ns()

    def _tree(self) -> list[psutil.Process]:
        now = now_ns()
        if self._refreshed_ns is not None and now - self._refreshed_ns < self.tree_refresh_ns:
            return self._members
        self._refreshed_ns = now
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            procs = [self.root]
        alive = []
        for p in procs:
            known = self._procs.get(p.pid)
            if known is None:  # new process (e.g. a DataLoader worker): prime its CPU counter
                self._procs[p.pid] = known = p
                try:
                    known.cpu_percent(None)
                except psutil.Error:
                    continue
            alive.append(known)
        self._members = alive
        return alive

    def read(self) -> list[HostSample]:
        cpu = 0.0
        rss = 0
        for p in self._tree():
            try:
                with p.oneshot():
                    cpu += p.cpu_percent(None)
                    rss += p.memory_info().rss
            except psutil.Error:
                continue
        system = psutil.cpu_percent(None)
        now = now_ns()
        short = now - self._cpu_read_ns < MIN_CPU_INTERVAL_S * 1e9  # since psutil's previous reading
        self._cpu_read_ns = now
        if short:  # too short to mean anything
            return [HostSample(t_ns=now, cpu_percent=None, rss_bytes=rss, system_cpu_percent=None)]
        return [HostSample(t_ns=now, cpu_percent=cpu, rss_bytes=rss, system_cpu_percent=system)]
