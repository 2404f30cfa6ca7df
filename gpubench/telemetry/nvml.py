"""Every NVML call of gpubench lives in this module (official nvidia-ml-py bindings).

A missing library, driver or GPU is a normal outcome: functions return a reason instead of
raising, and a field a device does not support is None in its samples. The NVML module is
passed in where it matters, so the tests drive a fake one.
"""

from __future__ import annotations

import threading
from typing import Any

from gpubench.measure.clocks import clock_ns
from gpubench.telemetry.base import GpuSample

# NVML GPM metric ids (nvml.h's NVML_GPM_METRIC_*) of the GpuSample fields they fill
GPM_METRICS = {"sm_active_pct": 2, "sm_occupancy_pct": 3, "tensor_active_pct": 5, "tensor_hmma_pct": 7,
               "dram_bw_pct": 10, "fp32_pct": 12, "fp16_pct": 13, "pcie_tx_mib_s": 20, "pcie_rx_mib_s": 21,
               "nvlink_rx_mib_s": 60, "nvlink_tx_mib_s": 61}
# clock-event reasons that mean the GPU is held back (idle and application clocks are not)
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # sw power cap, hw slowdown, sw/hw thermal, power brake
FI_POWER_INSTANT = 186  # NVML_FI_DEV_POWER_INSTANT (mW)


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def unofficial_pynvml_problem() -> str | None:
    """The unofficial ``pynvml`` package used to ship its own, outdated ``pynvml`` module,
    which shadows nvidia-ml-py's. Say how to fix it when that is what is installed."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("pynvml")
    except PackageNotFoundError:
        return None
    files = [str(f) for f in (dist.files or [])]
    try:
        distribution("nvidia-ml-py")
        official = True
    except PackageNotFoundError:
        official = False
    if "pynvml.py" in files or not official:
        return ("the unofficial 'pynvml' package provides the pynvml module here; use NVIDIA's bindings: "
                "pip uninstall -y pynvml && pip install nvidia-ml-py")
    return None


def load_nvml() -> tuple[Any | None, str | None]:
    """(the initialised pynvml module, or None with the reason)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    problem = unofficial_pynvml_problem()
    if problem:
        return None, problem
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"NVML unavailable: {e}"
    return pynvml, None


def _maybe(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or None where the GPU or driver does not say (NotSupported, no permission)."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: not a finding
        return None


def gpu_state(nvml: Any, h: Any) -> dict[str, Any]:
    """What tells a clean GPU from a shared or altered one (the clean-machine check): the
    processes using it, persistence mode, MIG, the power limit and its default, the
    application clocks and their default, uncorrected ECC errors since the driver loaded,
    and retired pages or remapped rows waiting for a reset. A field the GPU or driver does not
    report is None."""
    processes: list[dict[str, Any]] = []
    for fn in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
        for p in _maybe(fn, h) or []:
            if all(int(p.pid) != q["pid"] for q in processes):
                used = getattr(p, "usedGpuMemory", None)
                processes.append({"pid": int(p.pid), "used_memory_bytes": int(used) if used is not None else None})
    mig = _maybe(nvml.nvmlDeviceGetMigMode, h)
    limit = _maybe(nvml.nvmlDeviceGetPowerManagementLimit, h)
    default = _maybe(nvml.nvmlDeviceGetPowerManagementDefaultLimit, h)
    rows = _maybe(nvml.nvmlDeviceGetRemappedRows, h)
    pages = _maybe(nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
    persistence = _maybe(nvml.nvmlDeviceGetPersistenceMode, h)
    return {
        "processes": processes,
        "persistence_mode": None if persistence is None else persistence == nvml.NVML_FEATURE_ENABLED,
        "mig_mode": None if mig is None else mig[0] == nvml.NVML_DEVICE_MIG_ENABLE,
        "power_limit_w": None if limit is None else limit / 1000.0,
        "default_power_limit_w": None if default is None else default / 1000.0,
        "applications_clock_mhz": _maybe(nvml.nvmlDeviceGetApplicationsClock, h, nvml.NVML_CLOCK_SM),
        "default_applications_clock_mhz": _maybe(nvml.nvmlDeviceGetDefaultApplicationsClock, h, nvml.NVML_CLOCK_SM),
        "ecc_uncorrected_volatile": _maybe(nvml.nvmlDeviceGetTotalEccErrors, h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                           nvml.NVML_VOLATILE_ECC),
        "retired_pages_pending": None if pages is None else pages == nvml.NVML_FEATURE_ENABLED,
        "remapped_rows_pending": None if rows is None else bool(rows[2]),
    }


def process_name(pid: int) -> str | None:
    """The name of a process, where this machine (and container) can see it."""
    try:
        import psutil

        return str(psutil.Process(pid).name())
    except Exception:  # noqa: BLE001 - gone, another container's, no permission
        return None


def machine_findings(gpus: list[dict[str, Any]], own_pids: frozenset[int] = frozenset()) -> list[str]:
    """One line for each finding of the clean-machine check on the GPUs of a fingerprint (their
    ``state``): other processes on a GPU (``own_pids`` left out), persistence mode off, MIG on,
    a power limit below its default, application clocks away from their default, uncorrected
    ECC errors, a retirement or row remapping waiting for a reset. Empty on a clean machine."""
    lines = []
    for g in gpus:
        st = g.get("state") or {}
        name = f"GPU {g.get('index')} ({g.get('name')})"
        others = [p for p in st.get("processes") or [] if p["pid"] not in own_pids]
        if others:
            shown = ", ".join(f"pid {p['pid']}" + (f" {p['name']}" if p.get("name") else "")
                              + (f" ({p['used_memory_bytes'] / 2**30:.1f} GiB)" if p.get("used_memory_bytes") else "")
                              for p in others)
            lines.append(f"{name}: {len(others)} other process(es) use it ({shown}): they share its compute and "
                         "memory, so measurements are not this config's alone")
        if st.get("persistence_mode") is False:
            lines.append(f"{name}: persistence mode is off: the driver sets the GPU up again for every process "
                         "(a slower first CUDA call in each config's cold start); nvidia-smi -pm 1 turns it on")
        if st.get("mig_mode") is True:
            lines.append(f"{name}: MIG is on: a config sees one GPU instance, a fraction of the GPU's compute and "
                         "memory")
        limit, default = st.get("power_limit_w"), st.get("default_power_limit_w")
        if limit is not None and default is not None and limit < default:
            lines.append(f"{name}: power limit {limit:g} W is below its default {default:g} W: clocks drop sooner "
                         "under load")
        clock, default_clock = st.get("applications_clock_mhz"), st.get("default_applications_clock_mhz")
        if clock is not None and default_clock is not None and clock != default_clock:
            lines.append(f"{name}: application clocks are set to {clock} MHz (default {default_clock} MHz): "
                         "results are for those clocks")
        if st.get("ecc_uncorrected_volatile"):
            lines.append(f"{name}: {st['ecc_uncorrected_volatile']} uncorrected ECC error(s) since the driver "
                         "loaded: the GPU's memory is failing")
        if st.get("retired_pages_pending") or st.get("remapped_rows_pending"):
            lines.append(f"{name}: a memory page retirement or row remapping waits for a GPU reset")
    return lines


def gpu_inventory(nvml: Any = None) -> tuple[list[dict[str, Any]], str | None]:
    """(GPUs with name, UUID, memory, PCI bus id, driver and ``state`` (gpu_state: the
    clean-machine check's figures); reason when NVML is unusable). ``nvml``: an initialised
    module (tests); else NVML is loaded here."""
    reason = None
    if nvml is None:
        nvml, reason = load_nvml()
    if nvml is None:
        return [], reason
    try:
        driver = as_text(nvml.nvmlSystemGetDriverVersion())
        cuda = _maybe(nvml.nvmlSystemGetCudaDriverVersion)
        cuda_driver = None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}"
        gpus: list[dict[str, Any]] = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            state = gpu_state(nvml, h)
            for p in state["processes"]:
                p["name"] = process_name(p["pid"])
            gpus.append({
                "index": i,
                "name": as_text(nvml.nvmlDeviceGetName(h)),
                "uuid": as_text(nvml.nvmlDeviceGetUUID(h)),
                "memory_total_bytes": int(nvml.nvmlDeviceGetMemoryInfo(h).total),
                "pci_bus_id": as_text(nvml.nvmlDeviceGetPciInfo(h).busId),
                "driver": driver,
                "cuda_driver": cuda_driver,
                "state": state,
            })
        return gpus, None
    except Exception as e:
        return [], f"NVML query failed: {e}"
    finally:
        _maybe(nvml.nvmlShutdown)


def nvml_index(ordinal: int, uuid: str | None, nvml_uuids: list[str], visible: str | None) -> int | None:
    """The NVML index of the framework's CUDA device ``ordinal``.

    The framework's own UUID of the device, when it gives one, settles it. Otherwise
    ``CUDA_VISIBLE_DEVICES`` (indices or UUID prefixes; MIG instances are not mapped) picks the
    physical device; NVML counts in PCI bus order, which is CUDA's order with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and, on machines of one GPU model, by default too.
    """
    norm = [u.removeprefix("GPU-").lower() for u in nvml_uuids]
    if uuid:
        u = uuid.removeprefix("GPU-").lower()
        if u in norm:
            return norm.index(u)
    candidates = list(range(len(nvml_uuids))) if visible is None else []
    for entry in [e.strip() for e in visible.split(",")] if visible and visible.strip() else []:
        if entry.isdigit():
            if int(entry) >= len(nvml_uuids):
                break  # CUDA ignores this entry and everything after it
            candidates.append(int(entry))
        elif entry.startswith("GPU-"):
            prefix = entry.removeprefix("GPU-").lower()
            matches = [i for i, u in enumerate(norm) if u.startswith(prefix)]
            if len(matches) != 1:
                break
            candidates.append(matches[0])
        else:  # MIG-..., or something CUDA would reject
            break
    return candidates[ordinal] if ordinal < len(candidates) else None


class NvmlReader:
    """Reads samples from a fixed set of NVML devices (handles fetched once). A field that
    raises NotSupported, or any other error, is None for that field only; the first error of
    each field is kept in ``errors``."""

    def __init__(self, nvml: Any, indices: list[int]) -> None:
        self.nvml = nvml
        self.indices = indices
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        self.errors: dict[str, str] = {}
        self.instant_power = all(self._instant_power(h) is not None for h in self.handles)
        # GPM: each device's previous sample and its time; gpm_reason says why there is none
        self.gpm_reason: str | None = None
        self._gpm_lock = threading.Lock()
        self._gpm: list[tuple[Any, int]] | None = self._gpm_start()

    def _gpm_start(self) -> list[tuple[Any, int]] | None:
        nv = self.nvml
        if not hasattr(nv, "nvmlGpmSampleGet"):
            self.gpm_reason = "this nvidia-ml-py has no GPM calls (nvidia-ml-py 12.535 or newer has them)"
            return None
        try:
            if not all(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice for h in self.handles):
                self.gpm_reason = "the GPU does not support NVML's GPM metrics (Hopper or newer does)"
                return None
        except Exception as e:  # noqa: BLE001 - a driver that refuses GPM: no counters, never a failure
            self.gpm_reason = f"NVML GPM: {type(e).__name__}: {e}"
            return None
        first: list[tuple[Any, int]] = []
        try:
            for h in self.handles:
                sample = nv.nvmlGpmSampleAlloc()
                first.append((sample, clock_ns()))
                nv.nvmlGpmSampleGet(h, sample)
            return first
        except Exception as e:  # noqa: BLE001
            for sample, _ in first:
                _maybe(nv.nvmlGpmSampleFree, sample)
            self.gpm_reason = f"NVML GPM: {type(e).__name__}: {e}"
            return None

    def _gpm_read(self, i: int, h: Any, t: int) -> dict[str, Any]:
        """The GPM metrics of device ``i`` since its previous sample (which this one replaces)."""
        with self._gpm_lock:  # close() may run while a stuck sampler thread is still here
            if self._gpm is None:
                return {}
            return self._gpm_pair(i, h, t, self._gpm)

    def _gpm_pair(self, i: int, h: Any, t: int, held: list[tuple[Any, int]]) -> dict[str, Any]:
        nv = self.nvml
        prev, t_prev = held[i]
        sample = None
        try:
            sample = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(h, sample)
        except Exception as e:  # noqa: BLE001
            if sample is not None:
                _maybe(nv.nvmlGpmSampleFree, sample)
            self.errors.setdefault("gpm", f"{type(e).__name__}: {e}")
            return {}
        out: dict[str, Any] = {"gpm_period_ns": t - t_prev}
        try:
            get = nv.c_nvmlGpmMetricsGet_t()
            get.version = nv.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = len(GPM_METRICS)
            get.sample1, get.sample2 = prev, sample
            for k, metric_id in enumerate(GPM_METRICS.values()):
                get.metrics[k].metricId = metric_id
            nv.nvmlGpmMetricsGet(get)
            for k, name in enumerate(GPM_METRICS):
                m = get.metrics[k]
                if m.nvmlReturn == 0:
                    out[name] = float(m.value)
                else:
                    self.errors.setdefault(f"gpm {name}", f"NVML return {m.nvmlReturn}")
        except Exception as e:  # noqa: BLE001
            self.errors.setdefault("gpm", f"{type(e).__name__}: {e}")
        finally:
            _maybe(nv.nvmlGpmSampleFree, prev)
            held[i] = (sample, t)
        return out

    def close(self) -> None:
        """Free the GPM samples held between readings (not while a stuck reading holds them: a
        leak then, never a double free)."""
        if not self._gpm_lock.acquire(timeout=1.0):
            return
        try:
            for sample, _ in self._gpm or []:
                _maybe(self.nvml.nvmlGpmSampleFree, sample)
            self._gpm = None
        finally:
            self._gpm_lock.release()

    @property
    def power_source(self) -> str:
        return "instant" if self.instant_power else "average"

    def _field(self, name: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - NVMLError_NotSupported and friends
            self.errors.setdefault(name, f"{type(e).__name__}: {e}")
            return None

    def _instant_power(self, handle: Any) -> float | None:
        try:
            (value,) = self.nvml.nvmlDeviceGetFieldValues(handle, [FI_POWER_INSTANT])
        except Exception:  # noqa: BLE001 - older drivers or bindings
            return None
        return value.value.uiVal / 1000.0 if getattr(value, "nvmlReturn", 0) == 0 else None

    def energy_mj(self) -> list[int | None]:
        return [self._field("energy_mj", self.nvml.nvmlDeviceGetTotalEnergyConsumption, h) for h in self.handles]

    def read(self) -> list[GpuSample]:
        nv = self.nvml
        out = []
        t = clock_ns()
        for i, (index, h) in enumerate(zip(self.indices, self.handles)):
            gpm = self._gpm_read(i, h, t) if self._gpm is not None else {}
            util = self._field("utilization", nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._field("memory", nv.nvmlDeviceGetMemoryInfo, h)
            if self.instant_power:
                power = self._instant_power(h)
            else:
                mw = self._field("power", nv.nvmlDeviceGetPowerUsage, h)
                power = None if mw is None else mw / 1000.0
            reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nv.nvmlDeviceGetCurrentClocksThrottleReasons
            out.append(GpuSample(
                t_ns=t,
                index=index,
                util_gpu_pct=None if util is None else float(util.gpu),
                util_mem_pct=None if util is None else float(util.memory),
                mem_used_bytes=None if mem is None else int(mem.used),
                mem_total_bytes=None if mem is None else int(mem.total),
                power_w=power,
                energy_mj=self._field("energy_mj", nv.nvmlDeviceGetTotalEnergyConsumption, h),
                sm_clock_mhz=self._field("sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                mem_clock_mhz=self._field("mem_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                temp_c=self._field("temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                clock_event_reasons=self._field("clock_event_reasons", reasons_fn, h),
                pstate=self._field("pstate", nv.nvmlDeviceGetPerformanceState, h),
                **gpm,
            ))
        return out

    def uuids(self) -> list[str]:
        return [as_text(self.nvml.nvmlDeviceGetUUID(h)) for h in self.handles]

    def names(self) -> list[str]:
        return [as_text(self.nvml.nvmlDeviceGetName(h)) for h in self.handles]
