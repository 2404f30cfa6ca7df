"""``gpubench calibrate``: measure (or show the cached) peaks of this machine's devices."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpubench.calibrate import kernel_label
from gpubench.calibrate.cache import (
    Calibration,
    CalibrationError,
    calibration_device,
    get_calibration,
    missing_reference_message,
    reference,
)
from gpubench.calibrate.datasheet import datasheet_for
from gpubench.errors import InputError
from gpubench.measure.kernels import PRECISIONS
from gpubench.results.outputs import check_output_file, write_output
from gpubench.results.store import json_text
from gpubench.settings import parse_device


def default_devices() -> list[str]:
    """The CPU, and the first GPU where NVML lists one."""
    from gpubench.telemetry.nvml import gpu_inventory

    return ["cpu"] + (["cuda:0"] if gpu_inventory()[0] else [])


def check_devices(devices: list[str]) -> list[str]:
    """The devices named, with the suites' aliases (gpu is cuda), cuda as cuda:0, no repeats."""
    names = []
    for d in devices:
        try:
            names.append(calibration_device(parse_device(d)))
        except ValueError as e:
            raise InputError(f"--device {d}: {e}") from None
    return list(dict.fromkeys(names))


def figures_table(calibrations: list[Calibration]) -> Table:
    """Measured figures and the kernel that set each, with the datasheet figure beside them
    where the GPU is in the table."""
    table = Table(title="device peaks: measured here by gpubench calibrate, the best of the frameworks' training "
                        "kernels (datasheet: NVIDIA's published dense figures, for reference only)",
                  title_justify="left")
    for col in ("device", "figure", "measured", "kernel", "datasheet", "measured / datasheet"):
        table.add_column(col, justify="left" if col in ("device", "figure", "kernel") else "right")
    for cal in calibrations:
        e = cal.entry
        sheet = datasheet_for(e.get("device_name"))
        label = f"{e['device']} ({e.get('device_name') or '?'})"
        kernels = e.get("peak_kernels") or {}
        rows: list[tuple[str, float | None, str, float | None]] = [
            (f"peak {p} (TFLOP/s)", e["peak_tflops"].get(p), kernel_label(kernels.get(p)),
             sheet.tflops.get(p) if sheet else None)
            for p in PRECISIONS if p in e["peak_tflops"]]
        copy = (e.get("details") or {}).get("copy") or {}
        rows.append(("memory bandwidth (GB/s)", e["memory_bandwidth_gbs"], copy.get("kernel", "torch copy_"),
                     sheet.bandwidth_gbs if sheet else None))
        for i, (figure, measured, kernel, datasheet) in enumerate(rows):
            ratio = f"{measured / datasheet:.0%}" if measured and datasheet else "-"
            table.add_row(label if i == 0 else "", figure, "-" if measured is None else f"{measured:.4g}", kernel,
                          f"{datasheet:g} (datasheet: {sheet.label})" if datasheet and sheet else "-", ratio)
    return table


def framework_lines(cal: Calibration) -> list[str]:
    """Which frameworks' kernels were timed; one line per framework left out and per precision
    without a peak, with the reason."""
    e = cal.entry
    frameworks = e.get("frameworks") or {}
    timed = [f"{name} {info.get('version')}" for name, info in frameworks.items() if not info.get("unavailable")]
    lines = [f"{e['device']}: kernels timed in {', '.join(timed)}"] if timed else []
    lines += [f"{e['device']}: {name} kernels not timed: {info['unavailable']}"
              for name, info in frameworks.items() if info.get("unavailable")]
    lines += [f"{e['device']}: no {p} peak: {why}" for p, why in (e.get("skipped") or {}).items()]
    lines += [f"{e['device']}: {kernel_label(k)} {k['precision']} not taken as a peak: {k['not_a_peak']}"
              for k in (e.get("details") or {}).get("kernels", []) if k.get("not_a_peak")]
    return lines


def summary(cal: Calibration) -> dict[str, Any]:
    sheet = datasheet_for(cal.entry.get("device_name"))
    return {**cal.entry, "cache_file": cal.cache_file, "from_cache": cal.cached,
            "datasheet": None if sheet is None else {"label": sheet.label, "tflops": sheet.tflops,
                                                     "bandwidth_gbs": sheet.bandwidth_gbs}}


def run_calibrate(devices: list[str] | None, force: bool, json_path: Path | None, console: Console) -> int:
    """0 when every device calibrated; 2 when the reference framework (PyTorch) or a device is
    missing; 1 when a measurement failed."""
    wanted = check_devices(devices) if devices else default_devices()
    check_output_file(json_path, "--json")
    if reference().package_build() is None:
        raise InputError(missing_reference_message())
    done: list[Calibration] = []
    code = 0
    for device in wanted:
        try:
            with console.status(f"calibrating {device} (a fresh process; seconds on a CPU, longer on a GPU)..."):
                cal = get_calibration(device, force=force)
        except CalibrationError as e:
            print(f"gpubench: error: {device}: {e}", file=sys.stderr)
            code = max(code, 2 if e.unavailable else 1)
            continue
        done.append(cal)
        seconds = f"measured now in {cal.entry.get('seconds', 0):.1f} s"
        how = (f"from the cache {cal.path} (measured {cal.entry.get('measured_at')}; --force measures again)"
               if cal.cached else f"{seconds}, cached in {cal.path}" if cal.saved
               else f"{seconds}, not cached (the warning above says why)")
        for line in [f"{device}: {how}", *framework_lines(cal)]:
            console.print(line, highlight=False, soft_wrap=True)
    if done:
        console.print(figures_table(done))
    if json_path is not None and done:
        write_output(json_path, json_text([summary(c) for c in done]), "--json")
    return code
