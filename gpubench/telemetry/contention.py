"""When a config shared its cores with other processes: the one rule, used by the summary, the
metric registry's help, the terminal and the report."""

from __future__ import annotations

# a config "shared its cores" when the machine was saturated over its measured windows and the
# other processes took at least SHARED_MIN_CORES of it and SHARED_MIN_SHARE of its cores
SATURATED_PCT = 90.0
SHARED_MIN_CORES = 0.25
SHARED_MIN_SHARE = 0.05
# a shorter span of measured windows gives no contention figure: the kernel counts CPU time in
# 10 ms ticks, so 0.1 s of a 2-core machine is 20 ticks (5% a tick)
MIN_SPAN_S = 0.1

RULE = (f"the machine at least {SATURATED_PCT:g}% busy while other processes used at least {SHARED_MIN_CORES:g} "
        f"core and {100 * SHARED_MIN_SHARE:g}% of the cores")


def over_span(span_s: float, tree_cpu_s: float, machine_busy_s: float, machine_total_s: float,
              cores: int) -> dict[str, object]:
    """What the machine did over the measured windows (first start to last end), from the CPU
    seconds counted between two readings: its busy share, the cores every other process used
    (the machine's busy cores less the worker tree's) and whether the config shared its cores;
    where the span is under ``MIN_SPAN_S``, the reason instead of the figures."""
    out: dict[str, object] = {"cores": cores, "span_s": span_s}
    if span_s < MIN_SPAN_S or machine_total_s <= 0:
        return {**out, "machine_busy_pct": None, "others_cores": None, "shared_cores": None,
                "others_reason": f"the measured windows span {span_s:.3g} s, under the {MIN_SPAN_S:g} s a contention "
                                 "figure needs (CPU time is counted in 10 ms ticks): more steps or a larger window_s"}
    busy_pct = min(100.0, 100.0 * machine_busy_s / machine_total_s)
    others = max(0.0, busy_pct / 100.0 * cores - tree_cpu_s / span_s)
    return {**out, "machine_busy_pct": busy_pct, "others_cores": others,
            "shared_cores": shared_cores(others, busy_pct, cores)}


def shared_cores(others_cores: float | None, system_pct: float | None, cores: int) -> bool | None:
    """Whether the config shared its cores (``RULE``); None where a figure is missing."""
    if others_cores is None or system_pct is None:
        return None
    return system_pct >= SATURATED_PCT and others_cores >= max(SHARED_MIN_CORES, SHARED_MIN_SHARE * cores)
