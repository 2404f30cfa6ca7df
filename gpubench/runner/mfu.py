"""Model FLOP utilisation: a result's training FLOP/s against the measured peak of its device,
and against its datasheet's dense peak.

The parent looks the peaks up before the sweep (from the calibration cache, calibrating in a
child process where a device has none) and adds to every ok result:

- ``achieved_tflops`` = ``model.flops_per_sample`` x global throughput (median) / 1e12;
- ``peak_tflops``: the measured peak of the device at the config's precision (fp32 -> fp32,
  tf32 -> tf32, amp-fp16 -> fp16, amp-bf16 -> bf16: the best of the frameworks' training
  kernels), times the devices of a parallel strategy on GPUs (ddp:N, dp:N, mirrored:N: N GPUs,
  assumed alike: cuda:0 is calibrated). On the CPU every rank shares the one CPU that the
  calibration measured with all its cores, so the peak is not multiplied;
- ``mfu`` = achieved / ``peak_tflops``, but only where achieved <= peak: a peak below what
  training achieved is no ceiling (a stale cache, another load on the machine while it was
  measured), and an MFU above 100% would mislead. Such a result gets
  ``peak_below_achieved: true`` instead, and the summaries say to recalibrate;
- ``peak``: which peak, from which calibration, set by which kernel;
- on a GPU in the datasheet table (``gpubench.calibrate.datasheet``), also
  ``datasheet_tflops``: its dense peak at the precision from the datasheet, times the devices,
  and ``mfu_datasheet`` = achieved / that (the field's convention: the figure to put beside a
  published MFU), or ``achieved_above_datasheet`` where achieved is above it (a FLOP count
  that cannot be right: no figure is printed); ``datasheet``: which row, from which document.
  It needs no calibration;
- where activation checkpointing recomputes layers (``model.hardware_flops_per_sample``),
  hardware FLOP utilisation beside the MFUs: ``achieved_hardware_tflops``, ``hfu`` and
  ``hfu_datasheet`` against the same two peaks (the recomputed forward counted, as Megatron's
  HFU counts it); a hardware rate above a peak flags that peak as above and leaves out the MFU
  against it too.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from gpubench.calibrate.cache import CalibrationError, calibration_device, get_calibration
from gpubench.calibrate.datasheet import datasheet_for
from gpubench.config import Config
from gpubench.errors import warn
from gpubench.options import device_kind
from gpubench.results.frame import device_model
from gpubench.results.result import Result

PEAK_PRECISION = {"fp32": "fp32", "tf32": "tf32", "amp-fp16": "fp16", "amp-bf16": "bf16"}


def peak_devices(configs: list[Config]) -> list[str]:
    """The devices whose peaks these configs need (``cuda`` and ``cuda:0`` are one)."""
    return sorted({calibration_device(c.device) for c in configs})


def load_peaks(devices: list[str], console: Console) -> dict[str, dict[str, Any]]:
    """Calibration entry per device, from the cache or measured now; a device that cannot be
    calibrated is left out with a one-line note (its results get no mfu)."""
    peaks: dict[str, dict[str, Any]] = {}
    for device in devices:
        try:
            with console.status(f"calibrating {device} once for MFU (--no-calibrate skips it)..."):
                cal = get_calibration(device)
        except CalibrationError as e:
            warn(f"no peaks for {device} (results will have no mfu): {e}")
            continue
        peaks[device] = {**cal.entry, "cache_file": cal.cache_file}
        kernels = cal.entry.get("peak_kernels") or {}
        figures = ", ".join(f"{p} {v:.4g}" + (f" ({kernels[p].get('framework')} {kernels[p].get('op')})"
                                              if isinstance(kernels.get(p), dict) else "")
                            for p, v in cal.entry["peak_tflops"].items())
        console.print(f"peaks of {device} ({'cached' if cal.cached else 'measured now'}): TFLOP/s {figures}",
                      highlight=False, soft_wrap=True)
    return peaks


def mfu_metrics(result: Result, peaks: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """``achieved_tflops`` for an ok result with a FLOP count; ``peak_tflops`` and ``peak`` where
    its device has a measured peak at its precision, with ``mfu`` where achieved <= peak, else
    ``peak_below_achieved``; None for a result without a FLOP rate."""
    flops = result.get("model", "flops_per_sample")
    rate = result.get("metrics", "throughput", "median")
    if result.status != "ok" or not flops or not rate:
        return None
    out: dict[str, Any] = {"achieved_tflops": flops * rate / 1e12}
    config = Config.from_dict(result.config)
    out.update(datasheet_metrics(result, config, out["achieved_tflops"]))
    entry = peaks.get(calibration_device(config.device))
    precision = PEAK_PRECISION.get(config.precision)
    per_device = (entry or {}).get("peak_tflops", {}).get(precision)
    if entry is None or not per_device:
        return hardware_metrics(out, result.get("model", "hardware_flops_per_sample"), rate)
    # GPUs: every device of the strategy; CPU: the ranks of one node share its CPU, whose
    # calibration used all its cores, so one CPU per node
    devices = config.devices if device_kind(config.device) == "cuda" else config.nnodes
    out["peak_tflops"] = per_device * devices
    if out["achieved_tflops"] > out["peak_tflops"]:
        out["peak_below_achieved"] = True
    else:
        out["mfu"] = out["achieved_tflops"] / out["peak_tflops"]
    out["peak"] = {"source": "measured (gpubench calibrate)", "precision": precision, "per_device_tflops": per_device,
                   "devices": devices, "kernel": (entry.get("peak_kernels") or {}).get(precision),
                   "device": entry["device"], "device_name": entry.get("device_name"),
                   "measured_at": entry.get("measured_at"), "cache_file": entry.get("cache_file")}
    return hardware_metrics(out, result.get("model", "hardware_flops_per_sample"), rate)


def hardware_metrics(out: dict[str, Any], hardware_flops: Any, rate: float) -> dict[str, Any]:
    """``out`` with hardware FLOP utilisation where activation checkpointing recomputes layers
    (``model.hardware_flops_per_sample``: the model's FLOPs plus the recomputed forward):
    ``achieved_hardware_tflops``, and ``hfu`` / ``hfu_datasheet`` against the same peaks as
    ``mfu`` / ``mfu_datasheet``, each only where it is not above its peak. Above it, the device
    ran more FLOP/s than the peak, which is then no ceiling for the model's FLOPs either: the
    peak's flag (``peak_below_achieved``, ``achieved_above_datasheet``) and no MFU against it."""
    if not hardware_flops:
        return out
    out["achieved_hardware_tflops"] = achieved = hardware_flops * rate / 1e12
    for name, peak, flag, mfu in (("hfu", out.get("peak_tflops"), "peak_below_achieved", "mfu"),
                                  ("hfu_datasheet", out.get("datasheet_tflops"), "achieved_above_datasheet",
                                   "mfu_datasheet")):
        if peak and achieved <= peak:
            out[name] = achieved / peak
        elif peak:
            out[flag] = True
            out.pop(mfu, None)
    return out


def datasheet_metrics(result: Result, config: Config, achieved: float) -> dict[str, Any]:
    """``datasheet_tflops``, ``datasheet`` and ``mfu_datasheet`` (or ``achieved_above_datasheet``)
    of a CUDA result whose GPU is in the datasheet table at its precision; {} otherwise."""
    precision = PEAK_PRECISION.get(config.precision)
    name = device_model(result)
    sheet = datasheet_for(name) if device_kind(config.device) == "cuda" else None
    per_device = sheet.tflops.get(precision) if sheet is not None and precision else None
    if sheet is None or not per_device:
        return {}
    peak = per_device * config.devices
    out: dict[str, Any] = {"datasheet_tflops": peak, "datasheet": {
        "label": sheet.label, "source": sheet.source, "device_name": name, "precision": precision,
        "per_device_tflops": per_device, "devices": config.devices, "dense": True}}
    if achieved > peak:
        out["achieved_above_datasheet"] = True
    else:
        out["mfu_datasheet"] = achieved / peak
    return out
