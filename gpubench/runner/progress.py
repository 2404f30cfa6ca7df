"""What a sweep shows in the terminal: a progress bar (config k of n, current config, ETA),
a line per finished config, and the summary table."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from gpubench import fmt
from gpubench.calibrate import RECALIBRATE
from gpubench.results.metrics import BY_NAME, SUMMARY_COLUMNS, cost_line
from gpubench.results.result import Result
from gpubench.runner.job import Job

STATUS_STYLE = {"ok": "green", "oom": "yellow", "unsupported": "dim", "unavailable": "dim",
                "diverged": "magenta", "target_not_reached": "yellow", "timeout": "red", "error": "red"}


def _show(name: str, result: Result) -> str:
    m = BY_NAME[name]
    return fmt.metric(m.kind, m.value(result))


def one_line(result: Result) -> str:
    """``ok  12.3k samples/s [12.1k, 12.5k], step 5.21 ms, cv 2.1%`` or the status and reason."""
    if result.status == "ok" and result.get("metrics", "throughput"):
        text = (f"{_show('throughput', result)} samples/s [{_show('throughput_ci_low', result)}, "
                f"{_show('throughput_ci_high', result)}], "
                + (f"{_show('tokens_per_s', result)} tokens/s, " if BY_NAME["tokens_per_s"].value(result) else "")
                + f"step {_show('step_ms', result)}, "
                f"cv {_show('step_cv', result)}")
        return text + (" (noisy)" if BY_NAME["noisy"].value(result) else "") + shared_note(result)
    return result.reason


def shared_note(result: Result) -> str:
    """`` (shared cores: other processes used 0.9 of 2)`` where the config shared its cores."""
    if not BY_NAME["shared_cores"].value(result):
        return ""
    return (f" (shared cores: other processes used {_show('others_cores', result)} of "
            f"{result.get('telemetry', 'host', 'cores')})")


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

    def note(self, line: str) -> None:
        """A line between the finished configs' (above the progress bar on a terminal)."""
        (self.progress.console if self.progress else self.console).print(line, highlight=False, soft_wrap=True)

    def started(self, k: int, job: Job, side: str = "") -> None:
        if self.progress:
            self.progress.update(self.task, description=job.config.config_id + (f" ({side})" if side else ""))

    def finished(self, k: int, job: Job, result: Result, side: str = "") -> None:
        """The config's line; ``side``: which side of an A/B ran it."""
        status = result.status
        style = STATUS_STYLE.get(status, "")
        rep = f" r{job.repeat}" if job.repeat else ""
        rep += f" ({side})" if side else ""
        line = (f"[{k + 1}/{self.total}] {job.config.config_id}{rep}: [{style}]{status}[/{style}] "
                f"{escape(one_line(result))} ({result.duration_s or 0:.1f} s)")
        if self.progress:
            self.progress.console.print(line, highlight=False)
            self.progress.advance(self.task)
        else:
            elapsed = time.perf_counter() - self.t0
            eta = elapsed / (k + 1) * (self.total - k - 1)
            self.console.print(f"{line} eta {eta:.0f} s", highlight=False, soft_wrap=True)


def print_summary(console: Console, results: list[Result]) -> None:
    """The summary table, fitted to the terminal (fmt.fitted: short names for long ids, then
    without the cold-start, interval, memory and cv columns, in that order, at a narrow width)."""
    ids = list(dict.fromkeys(r.config_id for r in results if r.get("metrics", "throughput")))
    table, lines = fmt.fitted(console, lambda name, dropped: summary_table(results, name, dropped), ids,
                              droppable=("cold", "95% CI", "peak mem", "cv", "tensor %", "tokens/s"))
    console.print(table)
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)


def summary_table(results: list[Result], label: Callable[[str], str] = str,
                  dropped: frozenset[str] = frozenset()) -> Table:
    """Measured configs (ok, diverged, partially measured) one row each, named by ``label(id)``,
    without the columns in ``dropped``; a caption says to recalibrate where a result achieved
    more than its device's peak."""
    repeats = any(r.repeat for r in results)
    above = [r for r in results if r.get("metrics", "throughput") and BY_NAME["above_peak"].value(r)]
    lines = [f"MFU 'above peak': {len(above)} result(s) achieved more TFLOP/s than the calibrated peak, which is "
             f"therefore no ceiling (a stale calibration, or other load while it was measured); recalibrate with: "
             f"{RECALIBRATE}"] if above else []
    uncounted = {r.config["workload"]: note for r in results if r.get("metrics", "throughput")
                 and (note := r.get("model", "flops_note")) and not r.get("model", "flops_per_sample")}
    lines += [f"no MFU for {workload}: {note}" for workload, note in uncounted.items()]
    lines += [cost] if (cost := cost_line(results)) is not None else []
    caption = "\n".join(lines) or None
    table = Table(title="gpubench results", title_justify="left", caption=caption, caption_justify="left")
    table.add_column("config", no_wrap=True)
    if repeats:
        table.add_column("rep", justify="right")
    table.add_column("status", no_wrap=True)
    # a language model's tokens/s beside samples/s, where the sweep has one
    columns = [(c.header, c.metric) for c in SUMMARY_COLUMNS if c.terminal and c.header not in dropped
               and (not c.optional or any(BY_NAME[c.metric].value(r) is not None for r in results))]
    interval = "95% CI" not in dropped
    for header, _ in columns:
        table.add_column(header, justify="right", no_wrap=True)
        if header == "samples/s" and interval:
            table.add_column("95% CI", justify="right", no_wrap=True)
    for r in results:
        if not r.get("metrics", "throughput"):
            continue
        style = STATUS_STYLE.get(r.status, "")
        searched = r.get("metrics", "batch_search", "max_batch")
        row = [label(r.config_id) + (f" (bs {searched})" if searched else "")]
        if repeats:
            row.append(str(r.repeat))
        row.append(f"[{style}]{r.status}[/{style}]" + (" [yellow]noisy[/yellow]" if BY_NAME["noisy"].value(r) else "")
                   + (" [yellow]shared[/yellow]" if BY_NAME["shared_cores"].value(r) else ""))
        for header, name in columns:
            flagged = name == "mfu" and BY_NAME["above_peak"].value(r)
            row.append("[yellow]above peak[/yellow]" if flagged else _show(name, r))
            if header == "samples/s" and interval:
                row.append(f"{_show('throughput_ci_low', r)}-{_show('throughput_ci_high', r)}")
        table.add_row(*row)
    return table


def nothing_measured(results: list[Result]) -> str | None:
    """The line a command ends on when none of its results has a measurement (every config
    unavailable, unsupported, failed...): the statuses counted; None when one has."""
    if not results or any(r.get("metrics", "throughput") for r in results):
        return None
    counts = Counter(r.status for r in results)
    return ("nothing was measured: " + ", ".join(f"{status} x{n}" for status, n in counts.items())
            + " (the reasons above)")


def unmeasured_lines(results: list[Result]) -> list[str]:
    """Configs without a measurement, grouped by (status, reason): one line per group."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in results:
        if r.get("metrics", "throughput"):
            continue
        groups.setdefault((r.status, r.reason), []).append(r.config_id)
    lines = []
    for (status, reason), ids in groups.items():
        style = STATUS_STYLE.get(status, "")
        shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        lines.append(f"[{style}]{status}[/{style}] x{len(ids)}: {escape(reason)} ({escape(shown)})")
    return lines
