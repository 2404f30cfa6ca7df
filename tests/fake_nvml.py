"""A scripted stand-in for the pynvml module: enough of NVML for gpubench's telemetry."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    def __str__(self) -> str:
        return "Not Supported"


@dataclass
class FakeDevice:
    uuid: str
    name: str = "Fake GPU"
    util: int = 90
    mem_util: int = 40
    mem_used: int = 10 << 30
    mem_total: int = 80 << 30
    power_mw: int = 300_000  # what the averaged reading returns
    instant_mw: int | None = 310_000  # None: the field is not supported
    energy_per_read_mj: int | None = 1000  # the counter advances this much per read; None: unsupported
    sm_clock: int = 1980
    mem_clock: int = 2619
    temp: int = 60
    reasons: int = 0
    pstate: int = 0
    unsupported: set[str] = field(default_factory=set)
    broken: bool = False  # every call raises
    energy: int = 0
    # the clean-machine check's figures: (pid, used bytes) of the compute processes; persistence
    # mode and MIG (1 on); power limits in mW; SM application clocks; uncorrected volatile ECC
    # errors; pending page retirement (1: pending); remapped rows (corrected, uncorrected,
    # pending, failure)
    processes: list[tuple[int, int]] = field(default_factory=list)
    persistence: int = 1
    mig: tuple[int, int] = (0, 0)
    power_limit_mw: int = 700_000
    default_power_limit_mw: int = 700_000
    app_clock: int = 1980
    default_app_clock: int = 1980
    ecc_uncorrected: int = 0
    pages_pending: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    # GPM: each metric id's value over a pair of samples (None: the GPU has no GPM; an id left
    # out: that metric is not supported)
    gpm: dict[int, float] | None = None


class FakeNVML:
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0
    NVML_FEATURE_ENABLED = 1
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_GPM_METRICS_GET_VERSION = 1
    NVMLError = NVMLError

    class c_nvmlGpmMetricsGet_t:  # noqa: N801 - nvidia-ml-py's name
        def __init__(self) -> None:
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(98)]

    def __init__(self, devices: list[FakeDevice]) -> None:
        self.devices = devices
        self.calls = 0
        self.gpm_samples: set[int] = set()  # allocated and not freed

    def _dev(self, h: FakeDevice, name: str) -> FakeDevice:
        self.calls += 1
        if h.broken:
            raise NVMLError("GPU is lost")
        if name in h.unsupported:
            raise NVMLError_NotSupported()
        return h

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeDevice:
        return self.devices[i]

    def nvmlDeviceGetUUID(self, h: FakeDevice) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeDevice) -> str:
        return h.name

    def nvmlDeviceGetUtilizationRates(self, h):
        d = self._dev(h, "utilization")
        return SimpleNamespace(gpu=d.util, memory=d.mem_util)

    def nvmlDeviceGetMemoryInfo(self, h):
        d = self._dev(h, "memory")
        return SimpleNamespace(used=d.mem_used, total=d.mem_total, free=d.mem_total - d.mem_used)

    def nvmlDeviceGetPowerUsage(self, h):
        return self._dev(h, "power").power_mw

    def nvmlDeviceGetFieldValues(self, h, ids):
        d = self._dev(h, "fields")
        if d.instant_mw is None:
            return [SimpleNamespace(nvmlReturn=3, value=SimpleNamespace(uiVal=0))]
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=d.instant_mw))]

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        d = self._dev(h, "energy")
        if d.energy_per_read_mj is None:
            raise NVMLError_NotSupported()
        d.energy += d.energy_per_read_mj
        return d.energy

    def nvmlDeviceGetClockInfo(self, h, kind):
        d = self._dev(h, "clocks")
        return d.sm_clock if kind == self.NVML_CLOCK_SM else d.mem_clock

    def nvmlDeviceGetTemperature(self, h, kind):
        return self._dev(h, "temperature").temp

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._dev(h, "reasons").reasons

    def nvmlDeviceGetPerformanceState(self, h):
        return self._dev(h, "pstate").pstate

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.00"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:{self.devices.index(h) + 1:02X}:00.0")

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        d = self._dev(h, "processes")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0, computeInstanceId=0)
                for pid, used in d.processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        self._dev(h, "processes")
        return []

    def nvmlDeviceGetPersistenceMode(self, h):
        return self._dev(h, "persistence").persistence

    def nvmlDeviceGetMigMode(self, h):
        return list(self._dev(h, "mig").mig)

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return self._dev(h, "power_limit").power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):
        return self._dev(h, "power_limit").default_power_limit_mw

    def nvmlDeviceGetApplicationsClock(self, h, kind):
        return self._dev(h, "app_clock").app_clock

    def nvmlDeviceGetDefaultApplicationsClock(self, h, kind):
        return self._dev(h, "app_clock").default_app_clock

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        return self._dev(h, "ecc").ecc_uncorrected

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return self._dev(h, "retired_pages").pages_pending

    def nvmlDeviceGetRemappedRows(self, h):
        return self._dev(h, "remapped_rows").remapped_rows

    def nvmlGpmQueryDeviceSupport(self, h):
        return SimpleNamespace(version=1, isSupportedDevice=int(self._dev(h, "gpm").gpm is not None))

    def nvmlGpmSampleAlloc(self):
        sample = SimpleNamespace(device=None)
        self.gpm_samples.add(id(sample))
        return sample

    def nvmlGpmSampleFree(self, sample) -> None:
        self.gpm_samples.discard(id(sample))

    def nvmlGpmSampleGet(self, h, sample) -> None:
        sample.device = self._dev(h, "gpm")

    def nvmlGpmMetricsGet(self, get) -> None:
        d = get.sample2.device
        if get.sample1.device is not d or d.gpm is None:
            raise NVMLError("samples of different devices")
        for m in get.metrics[:get.numMetrics]:
            if m.metricId in d.gpm:
                m.nvmlReturn, m.value = 0, d.gpm[m.metricId]
            else:
                m.nvmlReturn, m.value = 3, 0.0  # NVML_ERROR_NOT_SUPPORTED
