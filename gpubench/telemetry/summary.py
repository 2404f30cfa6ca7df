"""Per-config telemetry summaries over the measured windows only (pure functions).

Energy comes from the GPU's cumulative energy counter read at each window's start and end.
Where a device has no counter, it is integrated from power samples over the windows (each
window: its duration times the mean power of the samples inside it), and ``energy_source``
says so, with the kind of power reading (``instant`` or the driver's 1 s ``average``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpubench.telemetry.base import GPM_FIELDS, GpuSample, HostSample
from gpubench.telemetry.contention import over_span
from gpubench.telemetry.host import Totals
from gpubench.telemetry.nvml import THROTTLE_MASK

Window = tuple[int, int]  # start_ns, end_ns

# the longest period over which NVML averages a reading (utilisation, the "average" power)
AVERAGING_S = 1.0


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


def device_energy(samples: Sequence[GpuSample], windows: list[Window],
                  counters: list[tuple[list[int | None], list[int | None]]], power_source: str,
                  devices: Sequence[int]) -> tuple[list[float | None], str]:
    """(joules over the windows for each of ``devices``, energy_source). ``counters``: per
    window, the counter (mJ) of every device, in the order of ``devices``, at its start and
    at its end. Counters are used only when every device has every reading; otherwise each
    device's energy is integrated from its power samples (None where a window has none)."""
    complete = [([int(v) for v in start if v is not None], [int(v) for v in end if v is not None])
                for start, end in counters]
    if counters and all(len(s) == len(start) and len(e) == len(end)
                        for (s, e), (start, end) in zip(complete, counters)):
        return [sum(end[j] - start[j] for start, end in complete) / 1000.0 for j in range(len(devices))], "counter"
    source = f"power_integration ({power_source})"
    out: list[float | None] = []
    for d in devices:
        total = 0.0
        for a, b in windows:
            p = _values([s for s in samples if s.index == d and a <= s.t_ns <= b], "power_w")
            if not len(p):
                break
            total += float(p.mean()) * (b - a) / 1e9
        else:  # every window had power samples (and there was a window)
            out.append(total if windows else None)
            continue
        out.append(None)
    return out, source


def gpu_energy(samples: Sequence[GpuSample], windows: list[Window], counters: list[tuple[list[int | None],
               list[int | None]]], power_source: str) -> tuple[float | None, str]:
    """(joules over the windows of every sampled device together, energy_source)."""
    per_device, source = device_energy(samples, windows, counters, power_source, sorted({s.index for s in samples}))
    return _total(per_device), source


def _total(per_device: list[float | None]) -> float | None:
    """The sum over the devices, or None when a device has no figure (or there is none)."""
    known = [e for e in per_device if e is not None]
    return sum(known) if per_device and len(known) == len(per_device) else None


def _settled(samples: Sequence[GpuSample], windows: list[Window], averaging_s: float) -> list[GpuSample]:
    """The samples whose averaging period lies inside the measured part of the run: taken at
    least ``averaging_s`` after the first window began (the gaps between windows are the
    harness's few microseconds, so a period spanning them is still training)."""
    if not windows:
        return []
    settle = windows[0][0] + int(averaging_s * 1e9)
    return [s for s in samples if s.t_ns >= settle]


def _gpm_inside(w: Sequence[GpuSample], windows: list[Window]) -> list[GpuSample]:
    """The samples whose GPM period began at or after the first measured window began (the
    gaps between windows are the harness's microseconds, so such a period is training)."""
    if not windows:
        return []
    return [s for s in w if s.gpm_period_ns is not None and s.t_ns - s.gpm_period_ns >= windows[0][0]]


def _weighted_mean(samples: Sequence[GpuSample], field: str) -> float | None:
    """The mean of a GPM figure over the time its samples cover (a reading after a failed one
    covers two periods)."""
    pairs = [(float(v), float(s.gpm_period_ns or 0)) for s in samples if (v := getattr(s, field)) is not None]
    total = sum(w for _, w in pairs)
    if not pairs:
        return None
    return sum(v * w for v, w in pairs) / total if total > 0 else sum(v for v, _ in pairs) / len(pairs)


def _device_summary(w: Sequence[GpuSample], settled: Sequence[GpuSample],
                    gpm: Sequence[GpuSample] = ()) -> dict[str, Any]:
    """``w``: the samples inside the windows; ``settled``: those of them whose averaged
    readings (utilisation) cover only the windows; ``gpm``: those whose GPM period does."""
    util = _values(settled, "util_gpu_pct")
    reasons = [s.clock_event_reasons for s in w if s.clock_event_reasons is not None]
    return {
        **{f"{f}_mean": _weighted_mean(gpm, f) for f in GPM_FIELDS},  # over the measured windows
        "util_mean": _mean(util),
        "util_p95": float(np.percentile(util, 95)) if len(util) else None,
        "mem_util_mean": _mean(_values(settled, "util_mem_pct")),
        "mem_used_peak_bytes": int(m) if (m := _max(_values(w, "mem_used_bytes"))) is not None else None,
        "power_mean_w": _mean(_values(w, "power_w")),
        "sm_clock_mean_mhz": _mean(_values(w, "sm_clock_mhz")),
        "mem_clock_mean_mhz": _mean(_values(w, "mem_clock_mhz")),
        "temp_max_c": _max(_values(w, "temp_c")),
        "throttled_fraction": (sum(bool(r & THROTTLE_MASK) for r in reasons) / len(reasons)) if reasons else None,
        "samples": len(w),
    }


def _energy_problem(windows: list[Window], counters: list[tuple[list[int | None], list[int | None]]],
                    source: str, averaging_s: float) -> str | None:
    """Why the energy over these windows cannot be trusted, or None."""
    total_s = sum(b - a for a, b in windows) / 1e9
    if total_s < averaging_s:
        return (f"the measured windows last {total_s:.3g} s in all, under the {averaging_s:g} s that NVML's energy "
                f"counter and power averaging need (more steps or a larger window_s give the figure)")
    if source == "counter" and any(e is not None and s is not None and e <= s
                                   for start, end in counters for s, e in zip(start, end)):
        return "the energy counter did not advance during a measured window (a window shorter than its step)"
    return None


def gpu_summary(samples: Sequence[GpuSample], windows: list[Window],
                counters: list[tuple[list[int | None], list[int | None]]], samples_measured: float,
                power_source: str, devices: Sequence[int] | None = None,
                averaging_s: float = AVERAGING_S, gpm_reason: str | None = None) -> dict[str, Any]:
    """The config's GPU figures over the windows, for every sampled device together, and each
    device's own under ``devices``. Together: utilisation, clocks, temperature and throttling
    over every device's samples; memory peak of the fullest device; power and energy summed
    over the devices. ``samples_measured``: the samples these devices trained on (energy per
    sample divides by it). Utilisation and energy are None, with the reason under
    ``not_reported``, where the windows are too short for NVML's averaging (module docstring)."""
    devices = list(devices) if devices is not None else sorted({s.index for s in samples})
    w = inside(samples, windows)
    settled = _settled(w, windows, averaging_s)
    not_reported: dict[str, str] = {}
    if not settled and w:
        span = (windows[-1][1] - windows[0][0]) / 1e9
        not_reported["utilisation"] = (
            f"the measured windows span {span:.3g} s, under the up to {averaging_s:g} s over which NVML averages "
            f"utilisation, so every reading would include the cold start and warm-up (more steps or a larger "
            f"window_s give the figure)" if span < averaging_s else
            f"no reading was taken {averaging_s:g} s or more after the first measured window began (a shorter "
            f"telemetry interval gives the figure)")
    gpm = _gpm_inside(w, windows)
    if gpm_reason is not None:
        not_reported["gpm"] = gpm_reason
    elif not gpm and any(s.gpm_period_ns is not None for s in w):
        not_reported["gpm"] = ("no GPM reading covered only the measured windows (they are shorter than the "
                               "telemetry interval: more steps, a larger window_s or a shorter interval give it)")
    elif gpm and all(getattr(s, f) is None for s in gpm for f in GPM_FIELDS):
        not_reported["gpm"] = "every GPM reading failed (telemetry.gpu.unsupported_fields says how)"
    per_energy, source = device_energy(samples, windows, counters, power_source, devices)
    if (problem := _energy_problem(windows, counters, source, averaging_s)) is not None:
        per_energy = [None] * len(devices)
        not_reported["energy"] = problem
    energy = _total(per_energy)
    per_device = [{"index": d, **_device_summary([s for s in w if s.index == d],
                                                 [s for s in settled if s.index == d],
                                                 [s for s in gpm if s.index == d]), "energy_j": e}
                  for d, e in zip(devices, per_energy)]
    powers = [p["power_mean_w"] for p in per_device]
    return {
        **_device_summary(w, settled, gpm),
        "power_mean_w": None if not powers or None in powers else sum(powers),
        "power_source": power_source,
        "energy_j": energy,
        "energy_per_sample_j": energy / samples_measured if energy is not None and samples_measured else None,
        "energy_source": source,
        "count": len(devices),
        "devices": per_device,
        "not_reported": not_reported,
    }


def host_summary(samples: Sequence[HostSample], windows: list[Window],
                 span: tuple[Totals, Totals] | None = None) -> dict[str, Any]:
    """The worker tree's CPU and memory over the windows (the sampler's readings), and what the
    machine and the other processes did over exactly the windows' span (``span``: the CPU
    totals read as the first window began and the last ended; contention.over_span)."""
    w = inside(samples, windows)
    cpu = _values(w, "cpu_percent")
    out: dict[str, Any] = {
        "cpu_percent_mean": _mean(cpu),
        "cpu_percent_max": _max(cpu),
        "rss_peak_bytes": int(m) if (m := _max(_values(w, "rss_bytes"))) is not None else None,
        "system_cpu_percent_mean": _mean(_values(w, "system_cpu_percent")),
        "samples": len(w),
    }
    if span is not None:
        a, b = span
        out.update(over_span((b.t_ns - a.t_ns) / 1e9, b.tree_cpu_s - a.tree_cpu_s, b.machine_busy_s - a.machine_busy_s,
                             b.machine_total_s - a.machine_total_s, b.cores))
    return out
