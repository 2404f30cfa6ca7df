"""``gpubench profile`` for JAX: steps under ``jax.profiler.trace``, reduced to operator rows.

JAX's profiler writes an XSpace (``<host>.xplane.pb``, for TensorBoard's and XProf's profile
plugins) and a Perfetto/Chrome trace (``perfetto_trace.json.gz``); both are kept. The rows are
read with ``jax.profiler.ProfileData``: on the host, the XLA instructions (``fusion.3``,
``wrapped_reduce-window``...) that ran on XLA's CPU threads, by self time (an instruction's span
less the spans nested in it on the same thread; the executor's own bookkeeping spans,
``ThunkExecutor::*``, ``ThreadpoolListener::*`` and the ``end: <op>`` markers, are left out); on a GPU, the kernels on
the device's streams, by time.
"""

from __future__ import annotations

import gzip
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import jax

from gpubench.measure.ops import OpRow, self_times
from gpubench.measure.trainer import Trainer

STEP_TRACE = "gpubench step"
# the executor's spans and markers: its program span, thread-pool regions, and the "end: <op>"
# marker each instruction leaves inside its own span
_BOOKKEEPING = ("ThunkExecutor::", "ThreadpoolListener::", "end: ")


def op_rows(data: jax.profiler.ProfileData) -> list[OpRow]:
    """Host rows from the XLA CPU threads (``tf_XLA*`` lines of ``/host:CPU``), device rows from
    the ``Stream`` lines of each ``/device:GPU`` plane."""
    host: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # calls, self ns, total ns
    device: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for plane in data.planes:
        if plane.name.startswith("/host:"):
            for line in plane.lines:
                if not line.name.startswith("tf_XLA"):
                    continue
                events = sorted(((e.start_ns, e.duration_ns, e.name) for e in line.events), key=lambda s: (s[0], -s[1]))
                for (_, dur, name), own in zip(events, self_times([(s, d) for s, d, _ in events])):
                    if name.startswith(_BOOKKEEPING):
                        continue
                    row = host[name]
                    row[0] += 1
                    row[1] += own
                    row[2] += dur
        elif plane.name.startswith("/device:GPU"):
            for line in plane.lines:
                if line.name.startswith("Stream"):
                    for e in line.events:
                        row = device[e.name]
                        row[0] += 1
                        row[1] += e.duration_ns
    rows = [OpRow(name, int(c), own / 1e6, total / 1e6) for name, (c, own, total) in host.items()]
    rows += [OpRow(name, int(c), 0.0, None, ns / 1e6) for name, (c, ns) in device.items()]
    return rows


def profile_steps(trainer: Trainer, steps: int, out_dir: Path) -> dict[str, Any]:
    """``steps`` steps, each in a ``gpubench step`` step annotation, under jax.profiler.trace;
    its directory (``jax/plugins/profile/<time>/``) is kept and the trace unpacked beside it."""
    logdir = out_dir / "jax"
    trainer.sync()
    with jax.profiler.trace(str(logdir), create_perfetto_trace=True):
        for i in range(steps):
            with jax.profiler.StepTraceAnnotation(STEP_TRACE, step_num=i):
                trainer.step()
        trainer.sync()
    found = sorted(logdir.glob("plugins/profile/*/*.xplane.pb"))
    if not found:
        raise RuntimeError(f"the JAX profiler wrote no .xplane.pb file under {logdir}")
    trace = out_dir / "trace.json"
    packed = sorted(found[-1].parent.glob("perfetto_trace.json.gz"))
    if packed:
        with gzip.open(packed[0], "rb") as src, open(trace, "wb") as dst:
            shutil.copyfileobj(src, dst)
    data = jax.profiler.ProfileData.from_file(str(found[-1]))
    return {"profiler": "jax.profiler.trace (XLA's host and device tracers)", "trace": trace if packed else found[-1],
            "logdir": logdir, "ops": op_rows(data), "steps": steps}
