"""CPU cost of the host telemetry sampler: what one reading costs, and what that adds up to
per second at the default rate.

What it measures, with ``time.thread_time`` (CPU time of the calling thread, so time spent
waiting is not counted) around each call, over ``--readings`` calls each:

- ``HostReader.read`` between tree refreshes (the known processes' ``/proc`` files, and the
  machine's ``/proc/stat``);
- ``HostReader.read`` when it re-lists the process tree first (psutil's ``children``, which
  scans every process on the machine, so it grows with the machine's process count);
- the re-listing alone.

The tree measured is this process and ``--children`` idle child processes (a DataLoader
worker pool's shape). The per-second figure is arithmetic on the measured means: at the
default telemetry interval the host sampler reads every ``HOST_MIN_INTERVAL_MS`` and
re-lists the tree once per ``tree_refresh_s``, so in one second ``n`` readings of which one
re-lists: ``(n - 1) x plain + 1 x with re-list``; divided by the machine's CPU capacity
(1000 ms of CPU per second per core) it is the share of the machine the sampler takes.

    PYTHONPATH=. python benchmarks/host_reader_cost.py [--readings 400] [--children 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]  # run from a plain checkout

import psutil  # noqa: E402

from gpubench.results.store import write_text_atomic  # noqa: E402
from gpubench.telemetry.host import HostReader  # noqa: E402
from gpubench.telemetry.session import HOST_MIN_INTERVAL_MS  # noqa: E402

TREE_REFRESH_S = 1.0  # HostReader's default, which TelemetrySession uses


def cpu_ms(fn: Callable[[], object], n: int) -> list[float]:
    """CPU time of this thread per call of ``fn``, in ms, ``n`` calls."""
    out = []
    for _ in range(n):
        start = time.thread_time()
        fn()
        out.append((time.thread_time() - start) * 1000.0)
    return out


def per_second(plain_ms: float, relist_ms: float, interval_ms: float = HOST_MIN_INTERVAL_MS,
               tree_refresh_s: float = TREE_REFRESH_S) -> float:
    """CPU ms per second of the host sampler: ``1000 / interval_ms`` readings a second, of which
    ``1 / tree_refresh_s`` re-list the tree."""
    readings = 1000.0 / interval_ms
    relists = min(readings, 1.0 / tree_refresh_s)
    return (readings - relists) * plain_ms + relists * relist_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readings", type=int, default=400, help="calls timed per figure (default 400)")
    parser.add_argument("--children", type=int, default=2, help="idle child processes in the tree (default 2)")
    parser.add_argument("--json", type=Path, help="write the figures as JSON")
    args = parser.parse_args(argv)

    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
                for _ in range(args.children)]
    try:
        time.sleep(0.2)  # the children exist before the first listing
        root = psutil.Process()
        plain = HostReader(tree_refresh_s=1e9)  # lists the tree once, at construction
        relisting = HostReader(tree_refresh_s=0.0)
        tree = len(relisting._tree())
        plain_ms = cpu_ms(plain.read, args.readings)
        relist_read_ms = cpu_ms(relisting.read, args.readings)
        listing_ms = cpu_ms(lambda: root.children(recursive=True), args.readings)
    finally:
        for c in children:
            c.kill()
            c.wait()

    cpus = psutil.cpu_count() or 1
    plain_mean, relist_mean = statistics.fmean(plain_ms), statistics.fmean(relist_read_ms)
    cost = per_second(plain_mean, relist_mean)
    share = cost / (1000.0 * cpus)
    figures = {
        "cpus": cpus, "processes_on_machine": len(psutil.pids()), "tree_processes": tree,
        "readings": args.readings, "interval_ms": HOST_MIN_INTERVAL_MS, "tree_refresh_s": TREE_REFRESH_S,
        "read_ms": {"mean": plain_mean, "median": statistics.median(plain_ms)},
        "read_with_relist_ms": {"mean": relist_mean, "median": statistics.median(relist_read_ms)},
        "relist_ms": {"mean": statistics.fmean(listing_ms), "median": statistics.median(listing_ms)},
        "cpu_ms_per_s": cost, "machine_share": share,
    }
    print(f"machine: {cpus} CPUs, {figures['processes_on_machine']} processes; tree read: {tree} processes")
    print(f"one reading (CPU ms, mean / median of {args.readings}): {plain_mean:.3f} / "
          f"{figures['read_ms']['median']:.3f}")
    print(f"one reading that re-lists the tree: {relist_mean:.3f} / {figures['read_with_relist_ms']['median']:.3f}"
          f" (the re-listing alone: {figures['relist_ms']['mean']:.3f} / {figures['relist_ms']['median']:.3f})")
    readings = 1000.0 / HOST_MIN_INTERVAL_MS
    print(f"per second at the default rate ({readings:g} readings, 1 re-listing): {readings - 1:g} x {plain_mean:.3f}"
          f" + 1 x {relist_mean:.3f} = {cost:.2f} ms of CPU per second = {100 * share:.3f}% of {cpus} CPUs")
    if args.json:
        write_text_atomic(args.json, json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
