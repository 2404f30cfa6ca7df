"""Host telemetry with psutil: the worker process tree's CPU and RSS, and the whole machine's CPU."""

from __future__ import annotations

import os

import psutil

from gpubench.telemetry.base import HostSample, now_ns


class HostReader:
    """CPU percent needs two readings; the first call primes every counter (and returns 0).

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
        return [HostSample(t_ns=now_ns(), cpu_percent=cpu, rss_bytes=rss, system_cpu_percent=psutil.cpu_percent(None))]
