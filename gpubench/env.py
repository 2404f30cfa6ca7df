"""The environment fingerprint every result carries, so that each result says where and with what it was measured."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

import gpubench
from gpubench.telemetry.nvml import gpu_inventory

_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "TF_NUM_INTRAOP_THREADS",
             "TF_NUM_INTEROP_THREADS")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
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
