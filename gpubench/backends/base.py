"""The Backend interface every framework implements, and the values it reports.

A backend translates a framework-neutral WorkloadSpec into a Trainer for one Config, and
declares the settings it supports (``capabilities``), which the suite and the runner check
before any process starts. Adding a framework is a package with its Backend and Trainer plus
one ``register_backend`` line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

# the Trainer interface lives beside the measurement loop; plugins import it from here
from gpubench.measure.trainer import Lap, ProfilingUnavailable, Trainer, no_lap
from gpubench.options import Capabilities

if TYPE_CHECKING:
    from gpubench.config import Config
    from gpubench.workloads.base import WorkloadSpec
    from gpubench.workloads.data import Batches

__all__ = ["Backend", "Capabilities", "DeviceInfo", "Lap", "ProbeInfo", "ProfilingUnavailable", "Trainer", "no_lap"]


@dataclass(frozen=True)
class DeviceInfo:
    name: str  # "cpu", "cuda:0", ...
    model: str  # "AMD EPYC ...", "NVIDIA H100 80GB HBM3"
    memory_bytes: int | None = None


@dataclass(frozen=True)
class ProbeInfo:
    """What a framework reports about itself and this machine (from a throw-away process)."""

    framework: str
    available: bool
    reason: str = ""  # why it is not available
    version: str | None = None
    devices: tuple[DeviceInfo, ...] = ()
    build: dict[str, Any] = field(default_factory=dict)  # CUDA/cuDNN versions, thread counts, ...

    def device_names(self) -> list[str]:
        return [d.name for d in self.devices]

    def to_dict(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "available": self.available,
            "reason": self.reason,
            "version": self.version,
            "devices": [vars(d) for d in self.devices],
            "build": self.build,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ProbeInfo:
        return ProbeInfo(
            framework=d["framework"],
            available=d["available"],
            reason=d.get("reason", ""),
            version=d.get("version"),
            devices=tuple(DeviceInfo(**x) for x in d.get("devices", [])),
            build=d.get("build", {}),
        )


class Backend(ABC):
    """A framework. Subclasses must import their framework lazily, inside methods, and set
    ``name``, ``install_hint`` and ``capabilities`` (checked when one is made)."""

    name: ClassVar[str]
    install_hint: ClassVar[str]
    capabilities: ClassVar[Capabilities]

    def __init__(self) -> None:
        missing = [a for a in ("name", "install_hint", "capabilities") if not hasattr(type(self), a)]
        if missing:
            raise TypeError(f"backend {type(self).__name__} must set: {', '.join(missing)}")
        if not isinstance(self.capabilities, Capabilities):
            raise TypeError(f"backend {type(self).__name__}: capabilities must be a Capabilities value")

    def unsupported(self, config: Config) -> str | None:
        """Why this framework can never run this config, or None: first what it declares it
        supports (``capabilities``), then its own rules for combinations (``static_unsupported``)."""
        return self.capabilities.problem(self.name, config) or self.static_unsupported(config)

    @abstractmethod
    def static_unsupported(self, config: Config) -> str | None:
        """Why this framework cannot run this combination of supported values (pure rules, no
        import), or None. Values outside ``capabilities`` never reach it."""

    @abstractmethod
    def probe(self) -> ProbeInfo:
        """Import the framework and describe it and its devices."""

    @abstractmethod
    def check(self, config: Config) -> tuple[str, str] | None:
        """(status, reason) when the config cannot run here ('unavailable' or 'unsupported');
        starts with ``unsupported``."""

    @abstractmethod
    def build(self, spec: WorkloadSpec, config: Config, batches: Batches) -> Trainer:
        """Translate the spec, load the canonical initial weights, put data on the device."""

    def set_threads(self, n: int) -> str | None:
        """``threads = n``: make this process train with ``n`` CPU threads (called before the
        trainer is built). None when done, else why this framework cannot."""
        return f"the {self.name} backend cannot set its CPU thread count"

    def before_profiled_build(self, config: Config) -> None:  # noqa: B027 - an optional hook
        """``gpubench profile``: anything the profiler needs set up before the trainer is
        built (nothing by default)."""

    @abstractmethod
    def is_oom(self, exc: BaseException) -> bool:
        """Whether an exception means the device (or host) ran out of memory."""

    def device_uuids(self, config: Config) -> list[str | None]:
        """The framework's UUID of each of the config's GPUs (``config.local_cuda_ordinals``),
        to find them in NVML (None where unknown)."""
        return [None] * len(config.local_cuda_ordinals)
