"""Read TensorFlow's profiler output (an XSpace protobuf, ``*.xplane.pb``): operator self
times, and a Chrome/Perfetto trace of every timeline.

In an XSpace, planes are devices (``/host:CPU``, ``/device:GPU:0``), lines are threads or
GPU streams, and events are spans (``offset_ps`` from the line's ``timestamp_ns``,
``duration_ps``). On the host, TensorFlow ops run on ``tf_Compute`` threads as events named
``scope/name:OpType``; their self time is their span minus the spans nested directly in them
on the same line. On a GPU, kernels run on ``Stream`` lines and do not nest.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpubench.files import write_text_atomic
from gpubench.measure.ops import OpRow, self_times

if TYPE_CHECKING:
    from tensorflow.tsl.profiler.protobuf.xplane_pb2 import XLine, XSpace

_TF_OP = re.compile(r"^[A-Za-z0-9_.\-/>]+:([A-Za-z0-9_]+)$")  # "sequential/dense/MatMul:MatMul"


def read_xspace(path: Path) -> XSpace:
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError:  # older TensorFlow layouts
        from tsl.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    return space


def _spans(line: XLine) -> list[tuple[int, int, int]]:
    """(start_ps, duration_ps, metadata_id) of a line's events, in start order, outer first."""
    base = line.timestamp_ns * 1000
    return sorted(((base + e.offset_ps, e.duration_ps, e.metadata_id) for e in line.events),
                  key=lambda s: (s[0], -s[1]))


def op_rows(space: XSpace) -> list[OpRow]:
    """Host: TensorFlow op types by self time; GPU: kernels by time (device planes' streams)."""
    host: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # calls, self ps, total ps
    device: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        if plane.name.startswith("/host:"):
            for line in plane.lines:
                spans = _spans(line)
                for (_, dur, mid), own in zip(spans, self_times([(start, dur) for start, dur, _ in spans])):
                    m = _TF_OP.match(names.get(mid, ""))
                    if m:
                        row = host[m.group(1)]
                        row[0] += 1
                        row[1] += own
                        row[2] += dur
        elif plane.name.startswith("/device:GPU"):
            for line in plane.lines:
                if line.name.startswith("Stream"):
                    for e in line.events:
                        row = device[names.get(e.metadata_id, "?")]
                        row[0] += 1
                        row[1] += e.duration_ps
    rows = [OpRow(name, int(c), own / 1e9, total / 1e9) for name, (c, own, total) in host.items()]
    rows += [OpRow(name, int(c), 0.0, None, ps / 1e9) for name, (c, ps) in device.items()]
    return rows


def chrome_trace(space: XSpace, path: Path) -> None:
    """Every plane as a process and every line as a thread, in the Chrome trace format."""
    events: list[dict[str, Any]] = []
    origin = min((line.timestamp_ns for p in space.planes for line in p.lines), default=0) * 1000
    for pid, plane in enumerate(space.planes, start=1):
        if not plane.lines:
            continue
        names = {k: v.name for k, v in plane.event_metadata.items()}
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": plane.name}})
        for tid, line in enumerate(plane.lines, start=1):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": line.display_name or line.name}})
            for start, dur, mid in _spans(line):
                events.append({"ph": "X", "name": names.get(mid, "?"), "pid": pid, "tid": tid,
                               "ts": (start - origin) / 1e6, "dur": dur / 1e6})
    write_text_atomic(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
