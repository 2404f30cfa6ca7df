"""A profile trace reduced to the figures that say why a config is slow, and a one-line reading.

The input is a Chrome-format trace as torch.profiler writes it (``traceEvents``, complete events
``"ph": "X"`` with ``ts`` and ``dur`` in microseconds). On a GPU trace:

- **device time**, from the first to the last GPU event, split into ``compute`` (kernels),
  ``communication`` (NCCL kernels), ``memory`` (copies and sets) and ``idle``; where events of
  several kinds overlap (streams), the instant counts once, as compute before communication
  before memory;
- **idle** split into ``host_wait`` (the launch of the work that ended the gap began after the
  gap did: the GPU waited for the host to ask) and ``other`` (the work had been asked for
  before: waiting on a dependency or a synchronisation);
- **short kernels**: the count and share of kernels under ``SHORT_US`` (10 microseconds), and
  their share of kernel time;
- **launch latency**: the median time from a launch call on the host to its kernel's start,
  matched by the trace's ``correlation`` ids.

A CPU trace (no GPU events) gives the host side: the main thread's span split into operator
time and the gaps between operators, the count of top-level operators (those not inside
another), the share of them under ``SHORT_US`` and their share of operator time, and the share
of the span in collectives (the ``gloo:``/``nccl:`` ranges of a distributed config's ranks).

Why gpubench's own code rather than Holistic Trace Analysis: HTA is not on the GPU machines
this project runs on (their images carry no registry to install it from), needs a directory of
per-rank traces, and pulls in a heavy stack; the figures are a few passes over the events.
(gpubench's torch traces stay readable by HTA: tests/test_profile.py loads them with it.)
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from pathlib import Path
from typing import Any

SHORT_US = 10.0
DEVICE_CATS = {"kernel": "compute", "gpu_memcpy": "memory", "gpu_memset": "memory"}
PRIORITY = ("compute", "communication", "memory")  # an instant in several kinds counts as the first
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
COLLECTIVE_PREFIXES = ("gloo:", "nccl:")  # the ranges torch.distributed's backends record around a collective


def _events(trace: dict[str, Any] | list[Any]) -> list[dict[str, Any]]:
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
            and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]


def _kind(e: dict[str, Any]) -> str | None:
    kind = DEVICE_CATS.get(str(e.get("cat", "")).lower())
    if kind == "compute" and "nccl" in str(e.get("name", "")).lower():
        return "communication"
    return kind


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _minus(intervals: list[tuple[float, float]], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``intervals`` without the parts in ``cut`` (both merged and sorted): one pass over both."""
    out: list[tuple[float, float]] = []
    j = 0
    for a, b in intervals:
        while j < len(cut) and cut[j][1] <= a:  # cuts wholly before this interval
            j += 1
        start, k = a, j
        while k < len(cut) and cut[k][0] < b:
            c, d = cut[k]
            if c > start:
                out.append((start, c))
            start = max(start, d)
            k += 1
        if start < b:
            out.append((start, b))
    return out


def device_breakdown(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The GPU side of a trace (module docstring), or None when it holds no GPU event. Times in
    ms, shares of the device span."""
    device = [(e, k) for e in events if (k := _kind(e)) is not None]
    if not device:
        return None
    start = min(e["ts"] for e, _ in device)
    end = max(e["ts"] + e["dur"] for e, _ in device)
    span = end - start
    taken: list[tuple[float, float]] = []
    ms: dict[str, float] = {}
    for kind in PRIORITY:
        mine = _union([(e["ts"], e["ts"] + e["dur"]) for e, k in device if k == kind])
        own = _minus(mine, taken)
        ms[kind] = _length(own) / 1000.0
        taken = _union(taken + mine)
    busy = _union(taken)
    gaps = [(b, c) for (_, b), (c, _) in zip(busy, busy[1:])]
    launches = {e.get("args", {}).get("correlation"): e for e in events
                if str(e.get("cat", "")).lower() in LAUNCH_CATS and e.get("args", {}).get("correlation") is not None}
    ordered = sorted((e for e, _ in device), key=lambda e: e["ts"])
    starts = [e["ts"] for e in ordered]
    host_wait = 0.0
    for a, b in gaps:
        # the device event that ends the gap, and when the host asked for it
        i = bisect.bisect_left(starts, b)
        nxt = ordered[i] if i < len(ordered) else {}
        launch = launches.get(nxt.get("args", {}).get("correlation"))
        if launch is not None and launch["ts"] >= a:
            host_wait += b - a
    idle = span - _length(busy)
    kernels = [e for e, k in device if k in ("compute", "communication")]
    short = [e for e in kernels if e["dur"] < SHORT_US]
    kernel_us = sum(e["dur"] for e in kernels)
    latencies = [e["ts"] - launches[c]["ts"] for e in kernels
                 if (c := e.get("args", {}).get("correlation")) in launches and e["ts"] >= launches[c]["ts"]]
    share = (lambda x: x / span) if span > 0 else (lambda x: 0.0)  # noqa: E731
    return {
        "span_ms": span / 1000.0,
        "compute_share": share(ms["compute"] * 1000.0),
        "communication_share": share(ms["communication"] * 1000.0),
        "memory_share": share(ms["memory"] * 1000.0),
        "idle_share": share(idle),
        "idle_host_wait_share": share(host_wait),
        "idle_other_share": share(idle - host_wait),
        "kernels": len(kernels),
        "short_kernels": len(short),
        "short_kernel_share": len(short) / len(kernels) if kernels else None,
        "short_kernel_time_share": sum(e["dur"] for e in short) / kernel_us if kernel_us else None,
        "launch_latency_median_us": statistics.median(latencies) if latencies else None,
        "short_us": SHORT_US,
    }


def host_breakdown(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The host side: the thread with the most operator time, its span split into top-level
    operators and the gaps between them; the count and share of short operators."""
    # operators only: a profiler's step ranges (user annotations, ProfilerStep#N) cover the whole
    # thread back to back and would hide every gap
    ops = [e for e in events if str(e.get("cat", "")).lower() == "cpu_op"]
    if not ops:
        return None
    by_thread: dict[Any, list[dict[str, Any]]] = {}
    for e in ops:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    main = max(by_thread.values(), key=lambda es: sum(e["dur"] for e in es))
    spans = _union([(e["ts"], e["ts"] + e["dur"]) for e in main])
    start, end = spans[0][0], spans[-1][1]
    span = end - start
    # top-level operators: those not inside another operator of the thread (an aten::linear's
    # aten::addmm is its work, not another operator the host dispatched)
    top: list[dict[str, Any]] = []
    for e in sorted((e for e in main if str(e.get("cat", "")).lower() == "cpu_op"), key=lambda e: (e["ts"], -e["dur"])):
        if not top or e["ts"] >= top[-1]["ts"] + top[-1]["dur"]:
            top.append(e)
    short = [e for e in top if e["dur"] < SHORT_US]
    op_us = sum(e["dur"] for e in top)
    # collectives, on whichever thread runs them (gloo's and NCCL's own ranges, "gloo:all_gather")
    comms = _union([(max(e["ts"], start), min(e["ts"] + e["dur"], end)) for e in events
                    if str(e.get("name", "")).lower().startswith(COLLECTIVE_PREFIXES)
                    and e["ts"] < end and e["ts"] + e["dur"] > start])
    return {
        "span_ms": span / 1000.0,
        "communication_share": _length(comms) / span if span else 0.0,
        "busy_share": _length(spans) / span if span else 0.0,
        "idle_share": 1 - _length(spans) / span if span else 0.0,
        "ops": len(top),
        "short_ops": len(short),
        "short_op_share": len(short) / len(top) if top else None,
        "short_op_time_share": sum(e["dur"] for e in short) / op_us if op_us else None,
        "short_us": SHORT_US,
    }


def trace_breakdown(trace: Path | dict[str, Any]) -> dict[str, Any]:
    """``{"device": ..., "host": ...}`` of a trace file or its loaded JSON (module docstring);
    either is None where the trace has no such events."""
    data = json.loads(Path(trace).read_text()) if isinstance(trace, (str, Path)) else trace
    events = _events(data)
    return {"device": device_breakdown(events), "host": host_breakdown(events)}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _room(cpu: dict[str, Any] | None) -> tuple[int, int, float, int] | None:
    """(threads, cores, the cores other processes used, the cores left to the config, a quarter
    core's slack and at least 1) from a CPU config's ``cpu`` (``threads``, the machine's
    ``cores``, ``others_cores`` over its measured windows: telemetry.host); None where the
    threads or the cores are not known."""
    threads, cores = (cpu or {}).get("threads"), (cpu or {}).get("cores")
    if not threads or not cores:
        return None
    others = (cpu or {}).get("others_cores") or 0.0
    return threads, cores, others, max(1, math.floor(cores - others + 0.25))


def oversubscription(cpu: dict[str, Any] | None) -> str | None:
    """Why a CPU config's threads waited for cores (more of them than the cores left to it), or
    None (``_room``)."""
    room = _room(cpu)
    if room is None or room[0] <= room[3]:
        return None
    threads, cores, others, free = room
    busy = f", other processes using {others:.1f} of them" if others >= 0.25 else ""
    return (f"oversubscribed: {threads} threads on {cores} cores{busy}, so threads wait for a core (and for "
            f"each other at every operator); fewer threads (threads = {free}) may well be faster, which "
            "gpubench advise measures")


def _more_threads(cpu: dict[str, Any] | None) -> str:
    """``, more threads (2 of 8 cores in use)`` where the config left cores free, else ""."""
    room = _room(cpu)
    if room is None:
        return ", more threads"  # not known: the reading cannot rule them out
    threads, cores, _, free = room
    return f", more threads ({threads} of {cores} cores in use)" if threads < free else ""


def reading(figures: dict[str, Any], cpu: dict[str, Any] | None = None) -> str:
    """One line from a trace breakdown saying what limits the config, derived from the figures
    (never guessed: each clause quotes the figure it rests on). ``cpu``: a CPU config's
    threads, the machine's cores and what other processes used of them (``oversubscription``):
    an oversubscribed config is read as such first, and more threads are suggested only where
    cores were free."""
    d = figures.get("device")
    if d is None:
        h = figures.get("host")
        if h is None:
            return "no reading: the trace holds neither device nor host operator events"
        over = oversubscription(cpu)
        if over is not None:
            return (f"{over}; the profile itself: operators run {_pct(h['busy_share'])} of the profiled span, "
                    f"idle {_pct(h['idle_share'])} between them")
        if h.get("communication_share", 0.0) >= 0.3:
            return (f"communication-bound: collectives take {_pct(h['communication_share'])} of the profiled span; "
                    "fewer, larger messages (a larger batch per rank, fewer shards: ddp where the state fits) "
                    "or a faster interconnect")
        if h["short_op_time_share"] is not None and h["short_op_time_share"] >= 0.3:
            return (f"host-bound on small operators: {_pct(h['short_op_share'] or 0.0)} of the {h['ops']} top-level "
                    f"operators run under {h['short_us']:g} us and take {_pct(h['short_op_time_share'])} of operator "
                    "time; a larger batch or a compiled step (torch.compile, XLA) does more work per operator")
        if h["idle_share"] >= 0.3:
            return (f"the host is idle {_pct(h['idle_share'])} of the profiled span between operators (Python, "
                    "the input pipeline, waiting): device-resident data or a compiled step shortens it")
        comms = h.get("communication_share", 0.0)
        among = f" (collectives {_pct(comms)} of it)" if comms >= 0.05 else ""
        return (f"compute-bound on the CPU: operators run {_pct(h['busy_share'])} of the profiled span{among}; "
                f"faster kernels (bf16 where the CPU has it{_more_threads(cpu)}) are what is left")
    if d["idle_share"] >= 0.3 and d["idle_host_wait_share"] >= 0.5 * d["idle_share"]:
        return (f"launch-bound: the GPU is idle {_pct(d['idle_share'])} of the span, "
                f"{_pct(d['idle_host_wait_share'])} waiting for the host to launch work; CUDA graphs or "
                "torch.compile remove launches, a larger batch gives each launch more work")
    if d["short_kernel_time_share"] is not None and d["short_kernel_time_share"] >= 0.3:
        return (f"many small kernels: {_pct(d['short_kernel_share'] or 0.0)} of {d['kernels']} kernels run under "
                f"{d['short_us']:g} us and take {_pct(d['short_kernel_time_share'])} of kernel time; fusion "
                "(torch.compile, XLA) or a larger batch gives the GPU longer work")
    if d["communication_share"] >= 0.3:
        return (f"communication-bound: collectives take {_pct(d['communication_share'])} of the device span; a "
                "larger batch per device, or overlapping them with the backward pass, hides them")
    if d["memory_share"] >= 0.2:
        return (f"copy-bound: memory copies take {_pct(d['memory_share'])} of the device span; keep the data on "
                "the device (data = device) or pin the host memory it comes from")
    if d["idle_share"] >= 0.3:
        return (f"the GPU is idle {_pct(d['idle_share'])} of the span, mostly waiting on work already asked for "
                "(synchronisation, dependencies), not on launches")
    if d["compute_share"] >= 0.8:
        return (f"compute-bound: kernels run {_pct(d['compute_share'])} of the device span; faster kernels "
                "(tf32 or bf16, channels-last, fused attention) are what is left")
    return (f"no single limit: compute {_pct(d['compute_share'])}, communication {_pct(d['communication_share'])}, "
            f"copies {_pct(d['memory_share'])}, idle {_pct(d['idle_share'])} of the device span")
