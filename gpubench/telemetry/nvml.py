"""Every NVML call of gpubench lives in this module (official nvidia-ml-py bindings).

A missing library, driver or GPU is a normal outcome: functions return a reason instead of
raising.
"""

from __future__ import annotations

from typing import Any


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_inventory() -> tuple[list[dict[str, Any]], str | None]:
    """(GPUs with name, UUID, memory, PCI bus id, driver; reason when NVML is unusable)."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return [], f"NVML unavailable: {e}"
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            cuda_driver = pynvml.nvmlSystemGetCudaDriverVersion()
            cuda_driver_str: str | None = f"{cuda_driver // 1000}.{cuda_driver % 1000 // 10}"
        except Exception:
            cuda_driver_str = None
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append({
                "index": i,
                "name": _text(pynvml.nvmlDeviceGetName(h)),
                "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                "pci_bus_id": _text(pynvml.nvmlDeviceGetPciInfo(h).busId),
                "driver": driver,
                "cuda_driver": cuda_driver_str,
            })
        return gpus, None
    except Exception as e:
        return [], f"NVML query failed: {e}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
