"""Telemetry for one config: samplers alongside the measurement loop, energy counters at the
window boundaries, and the per-config summary and timeline.

Nothing here may fail a config: every problem becomes ``telemetry.errors`` or
``telemetry.gpu_reason`` in the result.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from gpubench.measure.loop import Phase
from gpubench.options import device_index, device_kind
from gpubench.telemetry.base import PeriodicSampler
from gpubench.telemetry.host import HostReader, Totals
from gpubench.telemetry.nvml import NvmlReader, as_text, load_nvml, nvml_index
from gpubench.telemetry.summary import AVERAGING_S, gpu_summary, host_summary, windows_of

# The host sampler runs at the telemetry interval but never more often than this: the kernel
# counts process CPU time in 10 ms ticks, so a 100 ms CPU % is quantised to +-10 points, and a
# host reading costs CPU (0.43 ms, 3.6 ms when it re-lists the process tree, on the 2-vCPU
# development VM: benchmarks/host_reader_cost.py), which a training loop using every core pays
# for (see docs/performance.md).
HOST_MIN_INTERVAL_MS = 250


class TelemetrySession:
    """``ordinals``: the CUDA ordinals the config trains on in this node (every rank's,
    replica's or stage's device), with the framework's UUID of each where it has one;
    ``nodes``: the run's nodes, each training the same share (only this node's GPUs are
    sampled); ``averaging_s``: the longest period over which NVML averages a reading (the
    summary reports utilisation and energy only over windows that hold it)."""

    def __init__(self, device: str, interval_ms: int, uuids: Sequence[str | None] = (), nvml: Any = None,
                 host_pid: int | None = None, ordinals: Sequence[int] | None = None, nodes: int = 1,
                 averaging_s: float = AVERAGING_S) -> None:
        self.interval_s = interval_ms / 1000.0
        self.averaging_s = averaging_s
        self.host_interval_s = max(interval_ms, HOST_MIN_INTERVAL_MS) / 1000.0
        self.nodes = nodes
        self.errors: list[str] = []
        self.gpu_reason: str | None = None
        self.reader: NvmlReader | None = None
        self.counters: list[tuple[list[int | None], list[int | None]]] = []
        self._window_start: list[int | None] | None = None
        self.host_reader = HostReader(host_pid)
        self._span_start: Totals | None = None
        self._span_end: Totals | None = None
        self.host = PeriodicSampler("host", self.host_interval_s, self.host_reader.read)
        self.gpu: PeriodicSampler | None = None
        if device_kind(device) != "cuda":
            self.gpu_reason = "not a GPU config"
            return
        ordinals = list(ordinals) if ordinals is not None else [device_index(device)]
        uuids = list(uuids) + [None] * (len(ordinals) - len(uuids))
        try:
            if nvml is None:
                nvml, reason = load_nvml()
                if nvml is None:
                    self.gpu_reason = reason
                    return
            nvml_uuids = [as_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)))
                          for i in range(nvml.nvmlDeviceGetCount())]
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            indices = [nvml_index(o, u, nvml_uuids, visible) for o, u in zip(ordinals, uuids)]
            if None in indices:
                unmapped = ordinals[indices.index(None)]
                self.gpu_reason = f"cannot map cuda:{unmapped} to an NVML device (CUDA_VISIBLE_DEVICES={visible!r})"
                return
            self.reader = NvmlReader(nvml, [i for i in indices if i is not None])
            self.gpu = PeriodicSampler("gpu", self.interval_s, self.reader.read)
        except Exception as e:  # noqa: BLE001 - a broken NVML costs the GPU telemetry, not the config
            self.gpu_reason = f"NVML error: {type(e).__name__}: {e}"
            self.reader = self.gpu = None

    def start(self) -> TelemetrySession:
        self.host.start()
        if self.gpu is not None:
            self.gpu.start()
        return self

    # --- the measurement loop's observer: energy counters at window boundaries ---------------

    def energy_j(self) -> float | None:
        """The sampled devices' cumulative energy counters, summed, in J; None where a device has
        none (or no GPU is sampled)."""
        if self.reader is None:
            return None
        try:
            reading = self.reader.energy_mj()
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"energy counter: {type(e).__name__}: {e}")
            return None
        return None if not reading or None in reading else sum(r for r in reading if r is not None) / 1000.0

    def on_phase(self, name: str, edge: str) -> None:
        if not name.startswith("window_"):
            return
        self._host_span(edge)
        if self.reader is None:
            return
        try:
            reading = self.reader.energy_mj()
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"energy counter: {type(e).__name__}: {e}")
            reading = [None] * len(self.reader.indices)
        if edge == "start":
            self._window_start = reading
        elif self._window_start is not None:
            self.counters.append((self._window_start, reading))
            self._window_start = None

    def _host_span(self, edge: str) -> None:
        """The CPU totals as the first window begins and as each ends (the last end stays):
        contention over exactly the measured span, whatever the sampler's interval."""
        try:
            if edge == "start" and self._span_start is None:
                self._span_start = self.host_reader.totals()
            elif edge == "end" and self._span_start is not None:
                self._span_end = self.host_reader.totals(refresh=False)
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"host CPU totals: {type(e).__name__}: {e}")

    # --- results ---------------------------------------------------------------------------

    def stop(self, phases: list[Phase], samples_measured: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the result's ``telemetry`` block, the timeline to save)."""
        host_samples = self.host.stop()
        gpu_samples = self.gpu.stop() if self.gpu is not None else []
        if self.reader is not None:
            self.reader.close()
        windows = windows_of(phases)
        t0 = phases[0].start_ns if phases else 0
        intervals = {"interval_ms": self.interval_s * 1000.0, "host_interval_ms": self.host_interval_s * 1000.0}
        summary: dict[str, Any] = {
            **intervals,
            "host": host_summary(host_samples, windows, (self._span_start, self._span_end)
                                 if self._span_start is not None and self._span_end is not None else None),
            "gpu": None,
            "gpu_reason": self.gpu_reason,
            "errors": self.errors + [f"host sampler: {e}" for e in self.host.errors],
        }
        fields = ("util_gpu_pct", "mem_used_bytes", "power_w", "energy_mj", "sm_clock_mhz", "temp_c")
        if self.reader is not None and not any(getattr(s, f) is not None for s in gpu_samples for f in fields):
            first = next(iter(self.reader.errors.values()), "no samples")
            summary["gpu_reason"] = f"no NVML field could be read ({first})"
        elif self.reader is not None and self.gpu is not None:
            # each node trains the same share of the samples, and only this node's GPUs are sampled
            gpu = gpu_summary(gpu_samples, windows, self.counters, samples_measured / self.nodes,
                              self.reader.power_source, self.reader.indices, self.averaging_s,
                              self.reader.gpm_reason)
            gpu["index"] = self.reader.indices[0]
            gpu["scope"] = ("this config's GPU" if gpu["count"] == 1 and self.nodes == 1 else
                            f"this config's {gpu['count']} GPUs" if self.nodes == 1 else
                            f"node 0's {gpu['count']} GPUs of {gpu['count'] * self.nodes} (energy per sample: "
                            "node 0's energy over node 0's share of the samples)")
            try:
                uuids, names = self.reader.uuids(), self.reader.names()
                gpu["uuid"], gpu["name"] = uuids[0], names[0]
                for d, u, n in zip(gpu["devices"], uuids, names):
                    d.update(uuid=u, name=n)
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"NVML name/uuid: {type(e).__name__}: {e}")
            gpu["unsupported_fields"] = sorted(self.reader.errors)
            summary["gpu"] = gpu
            summary["errors"] += [f"gpu sampler: {e}" for e in self.gpu.errors]
        def rel(samples: list[Any]) -> list[dict[str, Any]]:
            return [{**s.to_dict(), "t_ms": (s.t_ns - t0) / 1e6} for s in samples]
        timeline = {
            **intervals,
            "phases": [{"name": p.name, "start_ms": (p.start_ns - t0) / 1e6, "end_ms": (p.end_ns - t0) / 1e6}
                       for p in phases],
            "gpu": rel(gpu_samples),
            "host": rel(host_samples),
            "power_source": self.reader.power_source if self.reader is not None else None,
        }
        return summary, timeline
