"""The environment fingerprint every result carries, and what it says about low-precision speed
on this CPU."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import psutil

import gpubench
from gpubench.telemetry.nvml import gpu_inventory

_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "TF_NUM_INTRAOP_THREADS",
             "TF_NUM_INTEROP_THREADS")


# instruction-set features that decide low-precision (and fp32) matmul speed, as /proc/cpuinfo
# names them: x86's "flags" line, aarch64's "Features" line
CPU_FEATURES: dict[str, tuple[str, ...]] = {
    "x86": ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile",
            "amx_bf16", "amx_fp16"),
    "arm": ("asimd", "fphp", "asimdhp", "asimddp", "bf16", "i8mm", "sve", "sve2", "svebf16"),
}
# features any one of which computes in the precision (not merely converts to it, as f16c does)
NATIVE_FEATURES: dict[str, dict[str, tuple[str, ...]]] = {
    "x86": {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")},
    "arm": {"bf16": ("bf16",), "fp16": ("asimdhp",)},
}
# the configs' precisions that compute in bf16 / fp16
LOW_PRECISION = {"amp-bf16": "bf16", "amp-fp16": "fp16"}


def parse_cpuinfo(text: str) -> tuple[str | None, set[str]]:
    """(``x86`` / ``arm`` / None, the feature flags of the first processor listed) of a
    /proc/cpuinfo text."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if arch := {"flags": "x86", "features": "arm"}.get(key.strip().lower()):
            return arch, set(value.split())
    return None, set()


def cpu_features(text: str | None = None) -> dict[str, Any]:
    """``cpu_arch``, ``cpu_features`` (each listed feature: present or not) and ``cpu_native``
    (bf16 / fp16 computed natively: true, false, or None where /proc/cpuinfo says nothing)."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            text = ""
    arch, flags = parse_cpuinfo(text)
    if arch is None:
        return {"cpu_arch": None, "cpu_features": {}, "cpu_native": {"bf16": None, "fp16": None}}
    return {"cpu_arch": arch, "cpu_features": {f: f in flags for f in CPU_FEATURES[arch]},
            "cpu_native": {p: any(f in flags for f in names) for p, names in NATIVE_FEATURES[arch].items()}}


class _Config(Protocol):
    @property
    def config_id(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def precision(self) -> str: ...


def emulation_note(configs: Iterable[_Config], env: dict[str, Any], ran: bool = False) -> str | None:
    """One line for ``gpubench run`` to say before it starts (and, with ``ran``, for the report
    of the results), where CPU configs ask for bf16 or fp16 that this CPU (per the fingerprint
    ``env``) does not compute natively: they run emulated, often several times slower than
    fp32. None when there is nothing to say (no such configs, native support, or a CPU whose
    features are unknown)."""
    native, arch = env.get("cpu_native") or {}, env.get("cpu_arch")
    counts: dict[str, int] = {}
    for c in {c.config_id: c for c in configs}.values():
        p = LOW_PRECISION.get(c.precision)
        if p is not None and c.device.split(":", 1)[0] == "cpu" and native.get(p) is False:
            counts[c.precision] = counts.get(c.precision, 0) + 1
    if not counts or arch not in NATIVE_FEATURES:
        return None
    lacking = sorted({LOW_PRECISION[p] for p in counts})
    missing = " or ".join(f"{p} (no {'/'.join(NATIVE_FEATURES[arch][p])})" for p in lacking)
    which = " and ".join(f"{n} {p}" for p, n in sorted(counts.items()))
    return (f"this CPU has no native {missing}: {which} CPU config{'s' if sum(counts.values()) > 1 else ''} "
            f"{'ran' if ran else 'will run'} emulated, often several times slower than fp32")


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def git_revision(path: Path | None = None) -> dict[str, Any] | None:
    """Commit and dirty flag of the gpubench checkout (None when not a git checkout)."""
    where = str(path or Path(gpubench.__file__).resolve().parent.parent)
    try:
        commit = subprocess.run(["git", "-C", where, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10)
        if commit.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


def host_fingerprint() -> dict[str, Any]:
    gpus, nvml_reason = gpu_inventory()
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "cpu_model": cpu_model(),
        "cpu_logical_cores": psutil.cpu_count(logical=True),
        "cpu_physical_cores": psutil.cpu_count(logical=False),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        **cpu_features(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "gpubench": gpubench.__version__,
        "git": git_revision(),
        "env_vars": {k: os.environ[k] for k in _ENV_VARS if k in os.environ},
        "gpus": gpus,
        "nvml_reason": nvml_reason,
    }


def fingerprint(frameworks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Host fingerprint plus, per framework, its probe (version, build, devices)."""
    return {**host_fingerprint(), "frameworks": frameworks}
