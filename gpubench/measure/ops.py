"""Operator tables: the operators that took the most self time, on the host and on the device.

Both frameworks' profilers are reduced to the same rows (``OpRow``), so the tables, the
JSON file (gpubench.runner.profiling) and the printed summary are written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpubench.fmt import md_cell, md_row

TOP_N = 15


@dataclass(frozen=True)
class OpRow:
    name: str  # aten::addmm, a CUDA kernel, a TensorFlow op type (MatMul)
    calls: int
    self_cpu_ms: float  # host time inside the op, excluding the ops it called
    total_cpu_ms: float | None = None
    # GPU time of a device row (a CUDA kernel; a TensorFlow op's kernels); None for host rows
    # and without a device trace. Device rows alone add up to the GPU's busy time.
    self_device_ms: float | None = None


def self_times(spans: list[tuple[int, int]]) -> list[float]:
    """Each (start, duration) span's duration minus its direct children's: spans on one thread
    nest, and ``spans`` is in start order, outer first (a profiler's host events)."""
    selfs = [float(d) for _, d in spans]
    stack: list[int] = []
    for i, (start, dur) in enumerate(spans):
        while stack and spans[stack[-1]][0] + spans[stack[-1]][1] <= start:
            stack.pop()
        if stack:
            selfs[stack[-1]] -= dur
        stack.append(i)
    return selfs


def top(ops: list[OpRow], key: str, n: int = TOP_N) -> list[OpRow]:
    """The n rows with the largest ``key`` (rows where it is 0 or missing left out)."""
    rows = [o for o in ops if (getattr(o, key) or 0.0) > 0.0]
    return sorted(rows, key=lambda o: getattr(o, key), reverse=True)[:n]


def _share(value: float, total: float) -> str:
    return f"{100.0 * value / total:.1f}%" if total > 0 else "-"


def markdown_table(rows: list[OpRow], key: str, total: float, title: str) -> list[str]:
    lines = [f"### {md_cell(title)}", "", "| operator | calls | self ms | share |", "| --- | ---: | ---: | ---: |"]
    for o in rows:  # an operator's name is a framework's or a user's text: escaped (fmt.md_cell)
        lines.append(md_row((o.name, o.calls, f"{getattr(o, key):.3f}", _share(getattr(o, key), total))))
    return lines + [""]


def tables(ops: list[OpRow], n: int = TOP_N) -> dict[str, list[OpRow]]:
    """{"cpu": top by host self time, "device": top by device self time (empty without one)}."""
    return {"cpu": top(ops, "self_cpu_ms", n), "device": top(ops, "self_device_ms", n)}


def summary(ops: list[OpRow], n: int = 10) -> dict[str, Any]:
    """The top rows for the result line (``profile.top_cpu`` / ``profile.top_device``)."""
    t = tables(ops, n)
    return {"top_cpu": [{"name": o.name, "calls": o.calls, "self_ms": o.self_cpu_ms} for o in t["cpu"]],
            "top_device": [{"name": o.name, "calls": o.calls, "self_ms": o.self_device_ms} for o in t["device"]]}
