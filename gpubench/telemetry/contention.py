"""When a config shared its cores with other processes: the one rule, used by the summary, the
metric registry's help, the terminal and the report."""

from __future__ import annotations

# a config "shared its cores" when the machine was saturated over its measured windows and the
# other processes took at least SHARED_MIN_CORES of it and SHARED_MIN_SHARE of its cores
SATURATED_PCT = 90.0
SHARED_MIN_CORES = 0.25
SHARED_MIN_SHARE = 0.05
MIN_HOST_SAMPLES = 2  # fewer host readings inside the windows give no contention figure

RULE = (f"the machine at least {SATURATED_PCT:g}% busy while other processes used at least {SHARED_MIN_CORES:g} "
        f"core and {100 * SHARED_MIN_SHARE:g}% of the cores")


def shared_cores(others_cores: float | None, system_pct: float | None, cores: int) -> bool | None:
    """Whether the config shared its cores (``RULE``); None where a figure is missing."""
    if others_cores is None or system_pct is None:
        return None
    return system_pct >= SATURATED_PCT and others_cores >= max(SHARED_MIN_CORES, SHARED_MIN_SHARE * cores)
