"""The worker's profiling passes, after the measured windows of ``gpubench profile``:
first the where-time-goes breakdown, then the framework's profiler (trace + operator table).

Both passes train on (they take real steps), so they come after everything that is
measured; a distributed config runs them on every rank (the steps hold collectives) and
profiles on rank 0 only.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpubench.measure.trainer import ProfilingUnavailable
from gpubench.measure.breakdown import measure_breakdown
from gpubench.measure.loop import NO_RANGES
from gpubench.profile.ops import summary, write_op_tables

if TYPE_CHECKING:
    from gpubench.measure.trainer import Trainer
    from gpubench.measure.loop import RawMeasurement
    from gpubench.config import Config


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
    files = {"trace": captured["trace"], **write_op_tables(captured["ops"], out_dir,
                                                           f"{config.config_id}: {captured['profiler']}, {steps} steps")}
    if captured.get("logdir") is not None:
        files["logdir"] = captured["logdir"]
    rel = Path(options["rel"])
    block = {"dir": str(rel), "profiler": captured["profiler"], "steps": steps,
             "files": {k: str(rel / Path(v).relative_to(out_dir)) for k, v in files.items()},
             **summary(captured["ops"])}
    return metrics, block
