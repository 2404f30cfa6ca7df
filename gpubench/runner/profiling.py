"""The worker's profiling passes, after the measured windows of ``gpubench profile``:
first the where-time-goes breakdown, then the framework's profiler (trace + operator table).

Both passes train on (they take real steps), so they come after everything that is
measured; a distributed config runs them on every rank (the steps hold collectives) and
profiles on rank 0 only.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpubench.files import write_text_atomic
from gpubench.fmt import md_cell
from gpubench.measure.breakdown import measure_breakdown
from gpubench.measure.loop import NO_RANGES
from gpubench.measure.ops import OpRow, markdown_table, summary, tables
from gpubench.measure.trace import trace_breakdown
from gpubench.measure.trainer import ProfilingUnavailable

if TYPE_CHECKING:
    from gpubench.config import Config
    from gpubench.measure.loop import RawMeasurement
    from gpubench.measure.trainer import Trainer


def write_op_tables(ops: list[OpRow], out_dir: Path, heading: str) -> dict[str, Path]:
    """``top_ops.md`` (the two tables) and ``top_ops.json`` (every row)."""
    md, js = out_dir / "top_ops.md", out_dir / "top_ops.json"
    t = tables(ops)
    lines = [f"## {md_cell(heading)}", ""]
    lines += markdown_table(t["cpu"], "self_cpu_ms", sum(o.self_cpu_ms for o in ops),
                             "Top operators by self time on the CPU (host)")
    if t["device"]:
        lines += markdown_table(t["device"], "self_device_ms", sum(o.self_device_ms or 0.0 for o in ops),
                                 "Top operators by self time on the GPU")
    else:
        lines += ["No device trace (a CPU config): the host table is the whole picture.", ""]
    write_text_atomic(md, "\n".join(lines))
    write_text_atomic(js, json.dumps([asdict(o) for o in sorted(ops, key=lambda o: o.self_cpu_ms, reverse=True)],
                                     indent=1) + "\n")
    return {"top_ops_md": md, "top_ops_json": js}


def profile_trainer(trainer: Trainer, raw: RawMeasurement, config: Config, options: dict[str, Any]
                    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """({"breakdown": ..., "breakdown_reason": ...} for ``metrics``, the result's ``profile``
    block, or None on ranks other than 0). ``options``: ``steps``, ``dir`` (absolute), ``rel``
    (the same directory relative to the run directory)."""
    steps = int(options["steps"])
    ranges = trainer.ranges() or NO_RANGES
    step_ms = statistics.median(raw.step_times_ms) if raw.step_times_ms else None
    ranges.push("breakdown")
    breakdown, why = measure_breakdown(trainer, steps, step_ms)
    ranges.pop()
    metrics = {"breakdown": breakdown, "breakdown_reason": why or None}
    if trainer.rank != 0:
        for _ in range(steps):  # the same steps as rank 0's profiled ones (collectives)
            trainer.step()
        trainer.sync()
        return metrics, None
    out_dir = Path(options["dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    ranges.push("profiler")
    try:
        captured = trainer.profile(steps, out_dir)
    except ProfilingUnavailable as e:
        return metrics, {"dir": options["rel"], "error": str(e)}
    finally:
        ranges.pop()
    heading = f"{config.config_id}: {captured['profiler']}, {steps} steps"
    files = {"trace": captured["trace"], **write_op_tables(captured["ops"], out_dir, heading)}
    if captured.get("logdir") is not None:
        files["logdir"] = captured["logdir"]
    rel = Path(options["rel"])
    block = {"dir": str(rel), "profiler": captured["profiler"], "steps": steps,
             "files": {k: str(rel / Path(v).relative_to(out_dir)) for k, v in files.items()},
             **summary(captured["ops"]), **_breakdown_of(Path(captured["trace"]))}
    return metrics, block


def _breakdown_of(trace: Path) -> dict[str, Any]:
    """The trace's breakdown (gpubench.measure.trace), or why there is none: a trace in another
    format, or one without torch.profiler's event categories. Never a failure of the profile."""
    figures, why = None, None
    if trace.suffix != ".json":
        why = f"{trace.name}: the breakdown reads Chrome-format JSON traces"
    else:
        try:
            figures = trace_breakdown(trace)
        except Exception as e:  # noqa: BLE001 - an odd trace costs its breakdown, never the profile
            why = f"{trace.name}: {type(e).__name__}: {e}"
    if figures is not None and figures["device"] is None and figures["host"] is None:
        figures, why = None, (f"{trace.name}: no events of torch.profiler's categories (kernel, memcpy, cpu_op): "
                              "this profiler's trace is shown as it is, without a breakdown")
    # the reading is the worker's, which knows the threads and the machine's load (cpu_use)
    return {"trace_breakdown": figures, "reading": None, "trace_breakdown_reason": why}
