"""What a device allocator's snapshot says: the largest live allocations and, after an
out-of-memory failure, what was asked for and what was free.

The snapshot is PyTorch's (``torch.cuda.memory._snapshot()``, the dictionary
``_dump_snapshot`` pickles for pytorch.org/memory_viz): ``segments`` (each a cudaMalloc'd
range with its ``blocks``: ``size``, ``requested_size``, ``state``, ``frames``) and
``device_traces`` (per device, the allocator's actions while its history was recorded:
``alloc``, ``free_completed``, ``oom`` with ``size`` and ``device_free``, ...). Frames are
there only where the history was recorded (``torch.cuda.memory._record_memory_history``);
without it the sizes still are. Plain dictionaries in, plain dictionaries out: the reduction
is tested with scripted snapshots, and a backend whose allocator says the same in this shape
gets the same figures.
"""

from __future__ import annotations

from typing import Any

from gpubench import fmt

LARGEST = 10  # allocations listed
LIVE_STATES = ("active_allocated", "active_awaiting_free")
# frames inside these are the framework's, not the code that asked for the memory
FRAMEWORK_PARTS = ("/torch/", "/site-packages/", "/dist-packages/", "/gpubench/", "<frozen", "/python3.")


def _where(frames: Any) -> str:
    """The first Python frame of the user's code (else the first Python frame), as ``file:line
    name``; "" where the snapshot has no Python frames (history not recorded)."""
    if not isinstance(frames, list) or not frames:
        return ""
    ok = [f for f in frames if isinstance(f, dict) and str(f.get("filename", "")).endswith(".py")]
    if not ok:
        return ""
    mine = next((f for f in ok if not any(p in str(f["filename"]) for p in FRAMEWORK_PARTS)), ok[0])
    return f"{mine['filename']}:{mine.get('line', '?')} {mine.get('name', '')}".rstrip()


def largest_allocations(snapshot: dict[str, Any], n: int = LARGEST) -> list[dict[str, Any]]:
    """The ``n`` largest live blocks, largest first: ``bytes``, ``requested_bytes`` and
    ``where`` (the allocating frame, "" without the history)."""
    blocks = [b for seg in snapshot.get("segments") or [] for b in seg.get("blocks") or []
              if isinstance(b, dict) and b.get("state") in LIVE_STATES and isinstance(b.get("size"), int)]
    blocks.sort(key=lambda b: b["size"], reverse=True)
    return [{"bytes": b["size"], "requested_bytes": b.get("requested_size", b["size"]),
             "where": _where(b.get("frames"))} for b in blocks[:n]]


def _live_requested(snapshot: dict[str, Any], device: Any = None) -> int:
    """The bytes asked for by the live blocks (the history's actions carry the size asked for,
    not the rounded block size), of one device's segments or all."""
    return sum(int(b.get("requested_size", b.get("size")) or 0)
               for s in snapshot.get("segments") or [] if isinstance(s, dict)
               and (device is None or s.get("device", 0) == device)
               for b in s.get("blocks") or [] if isinstance(b, dict) and b.get("state") in LIVE_STATES)


def _totals(snapshot: dict[str, Any]) -> dict[str, int]:
    segs = [s for s in snapshot.get("segments") or [] if isinstance(s, dict)]
    return {"reserved_bytes": sum(int(s.get("total_size") or 0) for s in segs),
            "allocated_bytes": sum(int(s.get("allocated_size") or 0) for s in segs),
            "live_blocks": sum(1 for s in segs for b in s.get("blocks") or [] if b.get("state") in LIVE_STATES)}


def trace_entries(snapshot: dict[str, Any]) -> int:
    """How many allocator actions the recorded history holds (0: not recorded)."""
    return sum(len(t) for t in snapshot.get("device_traces") or [] if isinstance(t, list))


def peak_in_history(snapshot: dict[str, Any]) -> int | None:
    """The most bytes allocated at once on one device while the history was recorded (the
    largest over the devices), replayed from each device's ``alloc`` and ``free_completed``
    actions and counted from what was live when it started (the bytes the live blocks asked
    for now, minus the history's net allocations); None without a history."""
    peaks = []
    for device, trace in enumerate(snapshot.get("device_traces") or []):
        if not isinstance(trace, list) or not trace:
            continue
        deltas = [(+1 if e.get("action") == "alloc" else -1) * int(e.get("size") or 0)
                  for e in trace if isinstance(e, dict) and e.get("action") in ("alloc", "free_completed")]
        level = peak = max(0, _live_requested(snapshot, device) - sum(deltas))
        for d in deltas:
            level += d
            peak = max(peak, level)
        peaks.append(peak)
    return max(peaks) if peaks else None


def at_oom(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The allocator at an out-of-memory failure: what the failed request asked for and what the
    device still had free (from the history's last ``oom`` action; None without a history),
    the reserved and allocated totals and the largest live allocations."""
    ooms = [e for t in snapshot.get("device_traces") or [] if isinstance(t, list) for e in t
            if isinstance(e, dict) and e.get("action") == "oom"]
    last = ooms[-1] if ooms else {}
    return {"requested_bytes": last.get("size"), "device_free_bytes": last.get("device_free"), **_totals(snapshot),
            "largest": largest_allocations(snapshot)}


def history_facts(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What a recorded snapshot holds, for the result: its actions, the peak while recording,
    the totals and the largest live allocations when it was taken."""
    return {"entries": trace_entries(snapshot), "peak_allocated_bytes": peak_in_history(snapshot),
            **_totals(snapshot), "largest": largest_allocations(snapshot)}


def _largest(rows: list[dict[str, Any]], n: int = 3) -> str:
    return ", ".join(f"{fmt.nbytes(r['bytes'])}" + (f" ({r['where']})" if r.get("where") else "") for r in rows[:n])


def oom_line(oom: dict[str, Any]) -> str:
    """One line of the allocator at an out-of-memory failure (``metrics.oom``)."""
    asked = (f"asked for {fmt.nbytes(oom['requested_bytes'])} with {fmt.nbytes(oom['device_free_bytes'])} free; "
             if oom.get("requested_bytes") is not None and oom.get("device_free_bytes") is not None else "")
    largest = _largest(oom.get("largest") or [])
    return (f"at the failure: {asked}{fmt.nbytes(oom.get('allocated_bytes'))} allocated of "
            f"{fmt.nbytes(oom.get('reserved_bytes'))} reserved" + (f"; largest live: {largest}" if largest else ""))


def history_line(h: dict[str, Any], prefix: str = "") -> str:
    """One line of a recorded allocator history (``profile.memory_history``); ``prefix``: what
    goes before the snapshot's path (the run directory)."""
    if not h.get("file"):
        return f"no memory history: {h.get('reason') or 'not recorded'}"
    largest = _largest(h.get("largest") or [])
    return (f"memory history: {prefix}{h['file']} ({h.get('entries', 0)} allocator actions; peak "
            f"{fmt.nbytes(h.get('peak_allocated_bytes'))} allocated while recorded"
            + (f"; largest live at the end: {largest}" if largest else "") + "; open it at pytorch.org/memory_viz)")
