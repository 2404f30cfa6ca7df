"""``gpubench calibrate``: measure (or show the cached) peaks of this machine's devices."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpubench.calibrate import kernel_label
from gpubench.calibrate.cache import (
    DATASHEET_SLACK,
    Calibration,
    CalibrationError,
    calibration_device,
    get_calibration,
    missing_reference_message,
    reference,
)
from gpubench.calibrate.datasheet import datasheet_for
from gpubench.errors import InputError, stop_exit_code, stop_message
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


# A clean H100 SXM and H200 measured 67-90% of their rows, figure by figure (docs/gpu-validation.md),
# as "Maximum Achievable Matmul FLOPS" finds 80% of the H100's bf16 row: well below that
# range is a GPU that is held back, not one that measured noisily.
EXPECTED_FRACTION = 0.60


def verdict(measured: float | None, datasheet: float | None) -> str | None:
    """A measured figure against its datasheet row: "as expected" (at least EXPECTED_FRACTION
    of it), "low", or "above the datasheet" (more than its clock slack above: not the part its
    name says, or a figure that counted wrong); None where either is missing."""
    if not measured or not datasheet:
        return None
    ratio = measured / datasheet
    return ("above the datasheet" if ratio > DATASHEET_SLACK else "as expected" if ratio >= EXPECTED_FRACTION
            else "low")


def _rows(e: dict[str, Any]) -> list[tuple[str, float | None, str, float | None]]:
    """(figure, measured, kernel, datasheet figure) of a calibration entry."""
    sheet = datasheet_for(e.get("device_name"))
    kernels = e.get("peak_kernels") or {}
    rows: list[tuple[str, float | None, str, float | None]] = [
        (f"peak {p} (TFLOP/s)", e["peak_tflops"].get(p), kernel_label(kernels.get(p)),
         sheet.tflops.get(p) if sheet else None)
        for p in PRECISIONS if p in e["peak_tflops"]]
    copy = (e.get("details") or {}).get("copy") or {}
    rows.append(("memory bandwidth (GB/s)", e["memory_bandwidth_gbs"], copy.get("kernel", "torch copy_"),
                 sheet.bandwidth_gbs if sheet else None))
    return rows


def figures_table(calibrations: list[Calibration]) -> Table:
    """Measured figures and the kernel that set each, with the datasheet figure and the verdict
    against it beside them where the GPU is in the table."""
    table = Table(title="device peaks: measured here by gpubench calibrate, the best of the frameworks' training "
                        "kernels, against NVIDIA's published dense figures where the GPU is in the datasheet table",
                  title_justify="left")
    for col in ("device", "figure", "measured", "kernel", "datasheet", "measured / datasheet", "verdict"):
        table.add_column(col, justify="left" if col in ("device", "figure", "kernel", "verdict") else "right")
    for cal in calibrations:
        e = cal.entry
        sheet = datasheet_for(e.get("device_name"))
        label = f"{e['device']} ({e.get('device_name') or '?'})"
        for i, (figure, measured, kernel, datasheet) in enumerate(_rows(e)):
            ratio = f"{measured / datasheet:.0%}" if measured and datasheet else "-"
            table.add_row(label if i == 0 else "", figure, "-" if measured is None else f"{measured:.4g}", kernel,
                          f"{datasheet:g} (datasheet: {sheet.label})" if datasheet and sheet else "-", ratio,
                          verdict(measured, datasheet) or "-")
    return table


def verdict_lines(cal: Calibration, power_limit_w: float | None = None) -> list[str]:
    """What the verdicts against the datasheet row say, one line per figure that is not as
    expected, and the power limit where it is below the one the row assumes; where the GPU
    has no row, the line that says so."""
    e = cal.entry
    if not str(e["device"]).startswith("cuda"):
        return []
    sheet = datasheet_for(e.get("device_name"))
    if sheet is None:
        return [f"{e['device']}: {e.get('device_name') or 'this GPU'} is not in the datasheet table "
                "(docs/reference/datasheets.md): no verdict"]
    lines = []
    if power_limit_w is not None and sheet.watts is not None and power_limit_w < sheet.watts:
        lines.append(f"{e['device']}: its power limit is {power_limit_w:g} W, below the {sheet.watts:g} W "
                     f"{sheet.label}'s figures assume: clocks drop sooner, and its peaks with them")
    for figure, measured, _kernel, datasheet in _rows(e):
        word = verdict(measured, datasheet)
        if measured is None or datasheet is None:
            continue
        if word == "low":
            lines.append(f"{e['device']}: {figure} {measured:.4g} is {measured / datasheet:.0%} of the datasheet's "
                         f"{datasheet:g} ({sheet.label}), below the {EXPECTED_FRACTION:.0%} a clean GPU of the "
                         "table reaches: look for another process, a power or clock limit, heat or a MIG slice "
                         "(the clean-machine check of gpubench run prints what it finds)")
        elif word == "above the datasheet":
            lines.append(f"{e['device']}: {figure} {measured:.4g} is above the datasheet's {datasheet:g} "
                         f"({sheet.label}): the GPU is not the part its name matched, or the figure counted wrong")
    if not lines:
        lines.append(f"{e['device']}: every figure as expected against the datasheet ({sheet.label})")
    return lines


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
    verdicts = {figure: verdict(measured, datasheet) for figure, measured, _k, datasheet in _rows(cal.entry)}
    return {**cal.entry, "cache_file": cal.cache_file, "from_cache": cal.cached,
            "datasheet": None if sheet is None else {"label": sheet.label, "tflops": sheet.tflops,
                                                     "bandwidth_gbs": sheet.bandwidth_gbs, "watts": sheet.watts,
                                                     "source": sheet.source},
            "verdicts": {k: v for k, v in verdicts.items() if v is not None}}


def power_limits() -> dict[str, float]:
    """The enforced power limit of each GPU NVML lists, by UUID (empty without NVML)."""
    from gpubench.telemetry.nvml import gpu_inventory

    gpus, _ = gpu_inventory()
    return {g["uuid"].removeprefix("GPU-").lower(): g["state"]["power_limit_w"] for g in gpus
            if g.get("uuid") and (g.get("state") or {}).get("power_limit_w") is not None}


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
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (errors.Stopped)
            cached = ", ".join(str(c.path) for c in done if c.saved or c.cached)
            stop_message(e, f"{device} not calibrated; {f'cached before it: {cached}; ' if cached else ''}run the same "
                            "calibrate again to measure what is not cached")
            return stop_exit_code(e)
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
        limits = power_limits() if any(str(c.entry["device"]).startswith("cuda") for c in done) else {}
        for cal in done:
            entry = cal.entry
            uuid = str((entry.get("key") or {}).get("gpu_uuid") or entry.get("device_uuid") or ""
                       ).removeprefix("GPU-").lower()
            for line in verdict_lines(cal, limits.get(uuid)):
                console.print(line, highlight=False, soft_wrap=True)
    if json_path is not None and done:
        write_output(json_path, json_text([summary(c) for c in done]), "--json")
    return code
