"""What a sweep shows in the terminal: a progress bar (config k of n, current config, ETA),
a line per finished config, and the summary table."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from gpubench.calibrate import RECALIBRATE
from gpubench.results.schema import peak_memory
from gpubench.runner.sweep import Job

STATUS_STYLE = {"ok": "green", "oom": "yellow", "unsupported": "dim", "unavailable": "dim",
                "diverged": "magenta", "timeout": "red", "error": "red"}


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e4:
        return f"{value / 1e3:.1f}k"
    return f"{value:.1f}"


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "-"


def one_line(result: dict[str, Any]) -> str:
    """``ok  12.3k samples/s [12.1k, 12.5k], step 5.21 ms, cv 2.1%`` or the status and reason."""
    status = result["status"]
    m = result.get("metrics") or {}
    tp = m.get("throughput")
    if status == "ok" and tp:
        st = m["step_time_ms"]
        text = (f"{fmt_rate(tp['median'])} samples/s [{fmt_rate(tp['ci_low'])}, {fmt_rate(tp['ci_high'])}], "
                f"step {st['median']:.3g} ms, cv {100 * st['cv']:.1f}%")
        return text + (" (noisy)" if m.get("noisy") else "")
    return result.get("reason") or ""


class SweepDisplay:
    """Progress bar on a terminal; plain lines with an ETA elsewhere (CI logs)."""

    def __init__(self, console: Console, total: int) -> None:
        self.console = console
        self.total = total
        self.t0 = time.perf_counter()
        self.progress: Progress | None = None
        if console.is_terminal:
            self.progress = Progress(
                TextColumn("[bold]run"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=True)
            self.task = self.progress.add_task("", total=total)

    def __enter__(self) -> SweepDisplay:
        if self.progress:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress:
            self.progress.stop()

    def started(self, k: int, job: Job) -> None:
        if self.progress:
            self.progress.update(self.task, description=job.config.config_id)

    def finished(self, k: int, job: Job, result: dict[str, Any]) -> None:
        status = result["status"]
        style = STATUS_STYLE.get(status, "")
        rep = f" r{job.repeat}" if job.repeat else ""
        line = (f"[{k + 1}/{self.total}] {job.config.config_id}{rep}: [{style}]{status}[/{style}] "
                f"{escape(one_line(result))} ({result['duration_s']:.1f} s)")
        if self.progress:
            self.progress.console.print(line, highlight=False)
            self.progress.advance(self.task)
        else:
            elapsed = time.perf_counter() - self.t0
            eta = elapsed / (k + 1) * (self.total - k - 1)
            self.console.print(f"{line} eta {eta:.0f} s", highlight=False, soft_wrap=True)


def above_peak(metrics: dict[str, Any]) -> bool:
    """A result that achieved more than its calibrated peak (or an older one whose stored MFU is
    above 100%): it shows no MFU, but the hint to recalibrate."""
    mfu = metrics.get("mfu")
    return bool(metrics.get("peak_below_achieved")) or (isinstance(mfu, (int, float)) and mfu > 1)


def summary_table(results: list[dict[str, Any]]) -> Table:
    """Measured configs (ok, diverged, partially measured) one row each; a caption says to
    recalibrate where a result achieved more than its device's peak."""
    repeats = any(r.get("repeat", 0) for r in results)
    above = [r for r in results if (r.get("metrics") or {}).get("throughput") and above_peak(r["metrics"])]
    caption = (f"MFU 'above peak': {len(above)} result(s) achieved more TFLOP/s than the calibrated peak, which is "
               f"therefore no ceiling (a stale calibration, or other load while it was measured); recalibrate with: "
               f"{RECALIBRATE}" if above else None)
    table = Table(title="gpubench results", title_justify="left", caption=caption, caption_justify="left")
    table.add_column("config", no_wrap=True)
    if repeats:
        table.add_column("rep", justify="right")
    for col in ("status", "samples/s", "95% CI", "step ms", "cv", "cold ms", "peak mem", "MFU"):
        table.add_column(col, justify="left" if col == "status" else "right", no_wrap=True)
    for r in results:
        m = r.get("metrics") or {}
        tp, st = m.get("throughput"), m.get("step_time_ms")
        if not tp:
            continue
        peak = peak_memory(r)[0]
        status = r["status"]
        style = STATUS_STYLE.get(status, "")
        searched = (m.get("batch_search") or {}).get("max_batch")
        row = [r["config_id"] + (f" (bs {searched})" if searched else "")]
        if repeats:
            row.append(str(r.get("repeat", 0)))
        row += [
            f"[{style}]{status}[/{style}]" + (" [yellow]noisy[/yellow]" if m.get("noisy") else ""),
            fmt_rate(tp["median"]),
            f"{fmt_rate(tp['ci_low'])}-{fmt_rate(tp['ci_high'])}",
            f"{st['median']:.3g}",
            f"{100 * st['cv']:.1f}%",
            f"{m['cold_start_ms']:.0f}",
            fmt_bytes(peak),
            ("[yellow]above peak[/yellow]" if above_peak(m) else "-" if m.get("mfu") is None
             else f"{100 * m['mfu']:.1f}%"),
        ]
        table.add_row(*row)
    return table


def unmeasured_lines(results: list[dict[str, Any]]) -> list[str]:
    """Configs without a measurement, grouped by (status, reason): one line per group."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in results:
        if (r.get("metrics") or {}).get("throughput"):
            continue
        groups.setdefault((r["status"], r.get("reason") or ""), []).append(r["config_id"])
    lines = []
    for (status, reason), ids in groups.items():
        style = STATUS_STYLE.get(status, "")
        shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        lines.append(f"[{style}]{status}[/{style}] x{len(ids)}: {escape(reason)} ({escape(shown)})")
    return lines
