"""Calibrations cached per device and environment fingerprint, measured on demand.

One JSON file per device and key, ``calibration-<cpu|cuda>-<hash>.json``, in
``$GPUBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpubench/``, else ``~/.cache/gpubench/``. The
key holds what decides the peaks and is read in the parent without importing a framework or
touching CUDA:

- both: host name, CPU model, and what each registered framework says decides its kernels
  (``Backend.calibration_key``: PyTorch's version, CUDA build and git revision from its
  ``version.py``; TensorFlow's version and distribution and JAX's and jaxlib's versions from
  their package metadata), since every framework's kernels take part in the peaks;
- cpu: the number of cores this process may run on, the CPU's vector and matrix features
  (``gpubench env``'s cpu_features and cpu_native: a VM may move to a host with the same CPU
  model name and other features), and OMP_NUM_THREADS / MKL_NUM_THREADS when set (torch's
  thread count follows them);
- cuda:N: the GPU's name and UUID and the driver version, from NVML (the CUDA ordinal mapped
  through CUDA_VISIBLE_DEVICES); where NVML cannot map it, the ordinal and CUDA_VISIBLE_DEVICES.

A file that cannot be read, parsed or checked (an older ``cache_version`` included) is measured
again with a one-line warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gpubench
from gpubench.backends import BACKENDS, REFERENCE_FRAMEWORK, backend_class
from gpubench.backends.base import Backend
from gpubench.calibrate.datasheet import Datasheet, datasheet_for
from gpubench.env import cpu_features, cpu_model, usable_cores
from gpubench.errors import warn
from gpubench.launch import Interpreter, dying_with_parent
from gpubench.measure.kernels import PRECISIONS
from gpubench.options import device_index, device_kind
from gpubench.results.store import write_json_atomic

# 2: peaks are the best of the frameworks' training kernels (peak_tflops, peak_kernels), no
# longer torch.mm's matmul_tflops; 3: a kernel whose nominal rate beats the GPU's datasheet is
# no peak (an H100's fp32 peak had come from an FFT convolution, at 147% of the datasheet)
CACHE_VERSION = 3
CACHE_ENV = "GPUBENCH_CACHE_DIR"
TIMEOUT_S = {"cpu": 300, "cuda": 900}
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


class CalibrationError(Exception):
    """No calibration: ``unavailable`` when the reference framework (PyTorch) or the device is
    missing (bad input for ``gpubench calibrate``), else the measurement failed."""

    def __init__(self, message: str, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable


@dataclass
class Calibration:
    entry: dict[str, Any]  # what the child measured, plus cache_version, key, measured_at
    path: Path
    cached: bool  # read from the cache (False: measured now)
    saved: bool = True  # in the cache file (False: measured now, and the cache could not be written)

    @property
    def cache_file(self) -> str | None:
        return str(self.path) if self.saved else None


def cache_dir() -> Path:
    """``$GPUBENCH_CACHE_DIR``, else the XDG cache directory's ``gpubench``."""
    return Path(os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                / "gpubench")


def calibration_device(device: str) -> str:
    """The device a config's peak comes from: ``cuda`` is ``cuda:0``."""
    return "cuda:0" if device == "cuda" else device


def reference() -> type[Backend]:
    """The backend whose calibration child cannot be missed: it also measures the memory
    bandwidth (``backends.REFERENCE_FRAMEWORK``, PyTorch)."""
    return backend_class(REFERENCE_FRAMEWORK)


def missing_reference_message() -> str:
    ref = reference()
    return (f"calibration needs {ref.name} (it measures the memory bandwidth, and its kernels are among those "
            f"timed), which is not installed; install with: {ref.install_hint}")


def calibrating_backends() -> dict[str, type[Backend]]:
    """Every registered backend that declares calibration kernels, the reference first (a
    plugin's backend whose module cannot be imported is left out)."""
    out: dict[str, type[Backend]] = {}
    for name in (REFERENCE_FRAMEWORK, *(n for n in BACKENDS if n != REFERENCE_FRAMEWORK)):
        try:
            cls = backend_class(name)
        except (KeyError, ImportError):
            continue
        if cls.calibration_module:
            out[name] = cls
    return out


def calibration_key(device: str) -> dict[str, Any]:
    """The environment fields that decide a device's peaks (module docstring)."""
    if reference().package_build() is None:
        raise CalibrationError(missing_reference_message(), unavailable=True)
    kind = device_kind(device)
    key: dict[str, Any] = {"device": kind, "hostname": socket.gethostname(), "cpu_model": cpu_model()}
    for cls in calibrating_backends().values():
        key.update(cls.calibration_key())
    if kind == "cpu":
        key["cpu_affinity"] = usable_cores()
        key.update(cpu_features())  # (a VM keeps its host name and CPU model on a host with other features)
        key["thread_env"] = {k: os.environ[k] for k in _THREAD_VARS if k in os.environ}
        return key
    from gpubench.telemetry.nvml import gpu_inventory, nvml_index

    gpus, _ = gpu_inventory()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    idx = nvml_index(device_index(device), None, [g["uuid"] for g in gpus], visible)
    if idx is None:
        key.update(gpu=device, cuda_visible_devices=visible)
    else:
        key.update(gpu_name=gpus[idx]["name"], gpu_uuid=gpus[idx]["uuid"], driver=gpus[idx]["driver"])
    return key


def cache_file(key: dict[str, Any]) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / f"calibration-{key['device']}-{digest}.json"


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def entry_problem(entry: Any, key: dict[str, Any]) -> str | None:
    """Why a cached entry cannot be used, or None."""
    if not isinstance(entry, dict):
        return "not a JSON object"
    if entry.get("cache_version") != CACHE_VERSION:
        return f"cache_version {entry.get('cache_version')!r}, expected {CACHE_VERSION}"
    if entry.get("key") != key:
        return "its key does not match this environment"
    if not isinstance(entry.get("device"), str) or not isinstance(entry.get("device_name", ""), (str, type(None))):
        return "no valid device / device_name"
    peaks = entry.get("peak_tflops")
    if not isinstance(peaks, dict) or not peaks or not all(_positive(v) for v in peaks.values()):
        return "no valid peak_tflops"
    kernels = entry.get("peak_kernels")
    if not isinstance(kernels, dict) or set(kernels) != set(peaks) or not all(isinstance(k, dict)
                                                                              for k in kernels.values()):
        return "no valid peak_kernels"
    if not _positive(entry.get("memory_bandwidth_gbs")):
        return "no valid memory_bandwidth_gbs"
    return None


def read_cached(path: Path, key: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """(the cached entry or None, why an existing file is unusable; "" when it is fine or absent)."""
    if not path.exists():
        return None, ""
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        return None, "nested too deeply to read"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"{type(e).__name__}: {str(e)[:200]}"
    problem = entry_problem(entry, key)
    return (None, problem) if problem else (entry, "")


def run_child(module: str, device: str, launcher: Interpreter) -> dict[str, Any]:
    """Run a calibration child (``python -m module device``); the JSON object it printed, or
    CalibrationError."""
    timeout_s = TIMEOUT_S[device_kind(device)]
    try:
        proc = subprocess.run(dying_with_parent(launcher.command(module, device)), capture_output=True, text=True,
                              timeout=timeout_s, env=launcher.env(), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CalibrationError(f"calibrating {device} ({module}) took longer than {timeout_s} s") from None
    except OSError as e:
        raise CalibrationError(f"cannot start {launcher.python}: {e}") from None
    lines = proc.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    except ValueError:
        out = None
    if not isinstance(out, dict):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise CalibrationError(f"calibrating {device} ({module}) failed (exit code {proc.returncode}): {tail}")
    return out


def framework_child(name: str, cls: type[Backend], device: str, launcher: Interpreter) -> dict[str, Any]:
    """A framework's kernels beside the reference framework's, measured in a process of their
    own (its backend's ``calibration_module``); ``unavailable`` (with the reason) when it is not
    installed, cannot see the device, or its measurement failed: the calibration then goes on
    without it."""
    if cls.package_build() is None:
        return {"unavailable": f"{name} is not installed"}
    try:
        return run_child(cls.calibration_module, device, launcher)
    except CalibrationError as e:
        return {"unavailable": f"its measurement failed: {e}"}


# a measured rate may sit a little above a datasheet figure (boost clocks, rounding); further
# above it, the kernel did fewer operations than its nominal count
DATASHEET_SLACK = 1.05


def _beyond_datasheet(kernel: dict[str, Any], sheet: Datasheet | None) -> str | None:
    """Why a kernel's figure cannot be a peak: its nominal FLOPs per second beat the GPU's
    datasheet. cuDNN runs some fp32 convolutions as FFTs or Winograd transforms, which do fewer
    multiply-adds than the direct convolution counted, so their rate is not the hardware's."""
    if sheet is None:
        return None
    limit = sheet.tflops.get(kernel.get("precision", ""))
    tflops: float = kernel.get("tflops") or 0.0
    if limit is None or not _positive(tflops) or tflops <= DATASHEET_SLACK * limit:
        return None
    return (f"{tflops:.4g} TFLOP/s counted by nominal FLOPs is above the datasheet's {limit:g} ({sheet.label}): "
            f"the kernel did fewer operations than counted (an FFT or Winograd algorithm), so it is no peak")


def combine(torch_out: dict[str, Any], others: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The calibration entry from the children's figures: ``torch_out``, the reference
    framework's (its kernels, the device and the copy bandwidth), and ``others``, each other
    framework's by name. Per precision, the best kernel of every framework that ran
    (``peak_tflops``) and which one it was (``peak_kernels``); every kernel's figures in
    ``details``; frameworks that did not run, with the reason."""
    frameworks = {REFERENCE_FRAMEWORK: {**torch_out.get("framework", {}), "seconds": torch_out.get("seconds")},
                  **{name: ({"unavailable": out["unavailable"]} if out.get("unavailable")
                            else {**out.get("framework", {}), "seconds": out.get("seconds")})
                     for name, out in others.items()}}
    kernels = [*torch_out.get("kernels", []),
               *(k for out in others.values() if not out.get("unavailable") for k in out.get("kernels", []))]
    sheet = datasheet_for(torch_out.get("device_name"))
    best: dict[str, dict[str, Any]] = {}
    for k in kernels:
        beyond = _beyond_datasheet(k, sheet)
        if beyond:
            k["not_a_peak"] = beyond
        elif _positive(k.get("tflops")) and (k["precision"] not in best
                                             or k["tflops"] > best[k["precision"]]["tflops"]):
            best[k["precision"]] = k
    order = {p: i for i, p in enumerate(PRECISIONS)}
    precisions = sorted(best, key=lambda p: order.get(p, len(order)))
    skipped = dict(torch_out.get("skipped") or {})
    for k in kernels:  # a precision the device has, but on which no kernel ran
        if k["precision"] not in best and k["precision"] not in skipped:
            why = k.get("not_a_peak") or k.get("note") or "no figure"
            skipped[k["precision"]] = f"no kernel ran ({k['framework']} {k['op']}: {why})"
    return {
        "device": torch_out["device"], "device_name": torch_out.get("device_name"),
        "device_uuid": torch_out.get("device_uuid"),
        "peak_tflops": {p: best[p]["tflops"] for p in precisions},
        "peak_kernels": {p: {f: best[p][f] for f in ("framework", "op", "shape", "size")} for p in precisions},
        "memory_bandwidth_gbs": torch_out.get("memory_bandwidth_gbs"),
        "frameworks": frameworks,
        "skipped": skipped,
        "details": {"kernels": kernels, "copy": torch_out.get("copy")},
        "plan": torch_out.get("plan"),
    }


def measure_in_child(device: str, launcher: Interpreter = Interpreter()) -> dict[str, Any]:
    """Measure in fresh processes: the reference framework's kernels and the copy bandwidth, then
    every other framework's (where installed); the combined figures, or CalibrationError."""
    t0 = time.perf_counter()
    backends = calibrating_backends()
    out = run_child(reference().calibration_module, device, launcher)
    if out.get("missing_reference"):
        raise CalibrationError(missing_reference_message(), unavailable=True)
    if out.get("error"):
        raise CalibrationError(out["error"], unavailable=True)
    entry = combine(out, {name: framework_child(name, cls, device, launcher)
                          for name, cls in backends.items() if name != REFERENCE_FRAMEWORK})
    if not entry["peak_tflops"]:
        raise CalibrationError(f"calibrating {device}: no kernel ran at any precision ({entry['skipped']})")
    return {**entry, "seconds": time.perf_counter() - t0}  # both children, their imports included


def get_calibration(device: str, force: bool = False,
                    measure: Callable[[str], dict[str, Any]] = measure_in_child,
                    warn: Callable[[str], None] = warn) -> Calibration:
    """The cached calibration of ``device`` for this environment, measured (in a child
    process) and cached when there is none, it is unusable, or ``force``."""
    device = calibration_device(device)
    key = calibration_key(device)
    path = cache_file(key)
    if not force:
        entry, problem = read_cached(path, key)
        if entry is not None:
            return Calibration(entry, path, cached=True)
        if problem:
            warn(f"calibration cache {path} is unusable ({problem}); measuring again")
    measured = measure(device)
    entry = {"cache_version": CACHE_VERSION, "key": key,
             "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "gpubench": gpubench.__version__, **measured}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, entry)
    except OSError as e:
        warn(f"calibration not cached: cannot write {path}: {e}")
        return Calibration(entry, path, cached=False, saved=False)
    return Calibration(entry, path, cached=False)
