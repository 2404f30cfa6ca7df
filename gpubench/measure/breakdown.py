"""Where the time of a training step goes: data / forward / backward / optimizer / idle.

A separate, instrumented pass that runs *after* the measured windows (``gpubench profile``),
so it never perturbs them. Each step of the pass is split into phases by the trainer's
``phased_step``; at the end of each phase the device is synchronised and the phase clock
reads the time since the previous phase ended (CUDA events on a PyTorch GPU, the host clock
otherwise). The phases of a real step overlap on a GPU (the host queues the next kernels
while the device runs) and do not in the instrumented pass, so the phases are compared with
the measured windows' median step time:

- ``idle_ms`` = step time - sum of the phases, when positive: time of a real step spent
  outside the phases (Python between them, the device waiting for the host);
- ``overlap_ms`` = sum of the phases - step time, when positive: what the real step gains
  by overlapping its phases.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from gpubench.measure.clocks import clock_ns
from gpubench.measure.trainer import ProfilingUnavailable

if TYPE_CHECKING:
    from gpubench.measure.trainer import Trainer

PHASES = ("data", "forward", "backward", "optimizer")


METHOD = ("a separate pass of {steps} steps (after one untimed) after the measured windows; each phase ends with the "
          "device synchronised and is timed by {timing}; medians over the steps; idle_ms / overlap_ms compare their "
          "sum with the measured median step time")
TF_METHOD = ("; backward_ms = (forward + backward, timed together) - forward (a separate forward-only call), "
             "at least 0")


def measure_breakdown(trainer: Trainer, steps: int, step_ms: float | None) -> tuple[dict[str, Any] | None, str]:
    """(breakdown, "") or (None, why not). ``step_ms``: the measured median step time."""
    try:  # one untimed step first: the pass's own first-use costs (TensorFlow traces its functions)
        trainer.phased_step(_ignore)
    except ProfilingUnavailable as e:
        return None, str(e)
    clock = trainer.phase_clock()
    per_phase: dict[str, list[float]] = {p: [] for p in PHASES}
    walls: list[float] = []
    sums: list[float] = []  # each step's phases together
    by_difference = False
    for _ in range(steps):
        acc = dict.fromkeys(PHASES, 0.0)

        def lap(phase: str, acc: dict[str, float] = acc) -> None:
            acc[phase] = acc.get(phase, 0.0) + clock.lap()

        t0 = clock_ns()
        clock.start()
        trainer.phased_step(lap)
        walls.append((clock_ns() - t0) / 1e6)
        if "forward_backward" in acc:  # backward could only be timed with a forward: subtract it
            by_difference = True
            acc["backward"] += max(acc.pop("forward_backward") - acc["forward"], 0.0)
        for p in PHASES:
            per_phase[p].append(acc[p])
        sums.append(sum(acc[p] for p in PHASES))
    out: dict[str, Any] = {f"{p}_ms": statistics.median(v) for p, v in per_phase.items()}
    phases_ms = sum(out.values())
    out["phases_ms"] = phases_ms
    out["step_ms"] = step_ms
    out["idle_ms"] = max(step_ms - phases_ms, 0.0) if step_ms is not None else None
    out["overlap_ms"] = max(phases_ms - step_ms, 0.0) if step_ms is not None else None
    # a step's wall time encloses its phases; the medians of the two compare like with like
    # (the sum of the phases' medians, phases_ms, need not be below the median wall time)
    out["instrumented_step_ms"] = statistics.median(walls)
    out["instrumented_phases_ms"] = statistics.median(sums)
    out["steps"] = steps
    out["timing"] = clock.timing
    out["method"] = METHOD.format(steps=steps, timing=clock.timing) + (TF_METHOD if by_difference else "")
    return out, ""


def _ignore(phase: str) -> None:
    pass
