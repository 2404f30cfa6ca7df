"""Per-config telemetry summaries over the measured windows only (pure functions).

Energy comes from the GPU's cumulative energy counter read at each window's start and end.
Where a device has no counter, it is integrated from power samples over the windows (each
window: its duration times the mean power of the samples inside it), and ``energy_source``
says so, with the kind of power reading (``instant`` or the driver's 1 s ``average``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from gpubench.telemetry.base import GpuSample, HostSample
from gpubench.telemetry.nvml import THROTTLE_MASK

Window = tuple[int, int]  # start_ns, end_ns


def windows_of(phases: Sequence[Any]) -> list[Window]:
    return [(p.start_ns, p.end_ns) for p in phases if p.name.startswith("window_")]


def inside(samples: Sequence[Any], windows: list[Window]) -> list[Any]:
    return [s for s in samples if any(a <= s.t_ns <= b for a, b in windows)]


def _values(samples: Sequence[Any], field: str) -> np.ndarray:
    return np.array([v for s in samples if (v := getattr(s, field)) is not None], dtype=float)


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if len(x) else None


def _max(x: np.ndarray) -> float | None:
    return float(x.max()) if len(x) else None


def gpu_energy(samples: Sequence[GpuSample], windows: list[Window],
               counters: list[tuple[list[int | None], list[int | None]]], power_source: str) -> tuple[float | None, str]:
    """(joules over the windows, energy_source). ``counters``: per window, the counter (mJ)
    of every device at its start and at its end."""
    if counters and all(v is not None for start, end in counters for v in (*start, *end)):
        total_mj = sum(sum(e) - sum(s) for s, e in counters)
        return total_mj / 1000.0, "counter"
    total = 0.0
    devices = sorted({s.index for s in samples})
    for a, b in windows:
        for d in devices:
            p = _values([s for s in samples if s.index == d and a <= s.t_ns <= b], "power_w")
            if not len(p):
                return None, f"power_integration ({power_source})"
            total += float(p.mean()) * (b - a) / 1e9
    return (total if windows else None), f"power_integration ({power_source})"


def gpu_summary(samples: Sequence[GpuSample], windows: list[Window],
                counters: list[tuple[list[int | None], list[int | None]]], samples_measured: int,
                power_source: str) -> dict[str, Any]:
    w = inside(samples, windows)
    util = _values(w, "util_gpu_pct")
    reasons = [s.clock_event_reasons for s in w if s.clock_event_reasons is not None]
    energy, source = gpu_energy(samples, windows, counters, power_source)
    return {
        "util_mean": _mean(util),
        "util_p95": float(np.percentile(util, 95)) if len(util) else None,
        "mem_util_mean": _mean(_values(w, "util_mem_pct")),
        "mem_used_peak_bytes": int(m) if (m := _max(_values(w, "mem_used_bytes"))) is not None else None,
        "power_mean_w": _mean(_values(w, "power_w")),
        "power_source": power_source,
        "energy_j": energy,
        "energy_per_sample_j": energy / samples_measured if energy is not None and samples_measured else None,
        "energy_source": source,
        "sm_clock_mean_mhz": _mean(_values(w, "sm_clock_mhz")),
        "mem_clock_mean_mhz": _mean(_values(w, "mem_clock_mhz")),
        "temp_max_c": _max(_values(w, "temp_c")),
        "throttled_fraction": (sum(bool(r & THROTTLE_MASK) for r in reasons) / len(reasons)) if reasons else None,
        "samples": len(w),
    }


def host_summary(samples: Sequence[HostSample], windows: list[Window]) -> dict[str, Any]:
    w = inside(samples, windows)
    cpu = _values(w, "cpu_percent")
    return {
        "cpu_percent_mean": _mean(cpu),
        "cpu_percent_max": _max(cpu),
        "rss_peak_bytes": int(m) if (m := _max(_values(w, "rss_bytes"))) is not None else None,
        "system_cpu_percent_mean": _mean(_values(w, "system_cpu_percent")),
        "samples": len(w),
    }
