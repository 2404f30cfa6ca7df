"""``gpubench profile``: profile the configs of a suite, each in a fresh worker process.

A profile run is a run directory like ``run``'s (run.json, results.jsonl, logs/), whose
results carry ``metrics.breakdown`` and a ``profile`` block, plus ``profile/<config_id>/``
with the trace and the operator tables. Each worker measures the config as ``run`` does
(with NVTX ranges on CUDA), then runs the breakdown pass and the profiler pass.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpubench.errors import EXIT_FAILED, EXIT_OK, stop_exit_code, stop_message
from gpubench.launch import Interpreter
from gpubench.measure.allocations import history_line, oom_line
from gpubench.results.result import Result
from gpubench.results.schema import FAILED_STATUSES
from gpubench.results.store import slug
from gpubench.runner.job import Job
from gpubench.runner.launcher import LauncherChoice
from gpubench.runner.local import Local
from gpubench.runner.models import user_code_path
from gpubench.runner.session import Session, load
from gpubench.suite import Config

PRINTED_OPS = 10


@dataclass
class ProfileRequest:
    suite: str
    out: Path
    sets: list[str] = field(default_factory=list)
    steps: int = 10
    report: bool = True
    report_dir: Path | None = None  # where the report goes (None: beside the runs)
    memory_history: bool = False  # record the device allocator's history (runner.memory_history)
    launcher: LauncherChoice | None = None  # --launcher and its options (None: this machine)


def _jobs(configs: list[Config], run_dir: Path, steps: int, memory_history: bool = False) -> list[Job]:
    jobs = []
    for c in configs:
        where = {"rel": f"profile/{slug(c.config_id)}", "dir": str((run_dir / "profile" / slug(c.config_id)).resolve())}
        options: dict[str, Any] = {"profile": {"steps": steps, **where}}
        if memory_history:
            options["memory_history"] = dict(where)
        jobs.append(Job(c, 0, options=options))
    return jobs


def execute_profile(req: ProfileRequest, console: Console) -> int:
    suite = load(req.suite, req.sets)  # InputError -> exit 2, nothing written
    configs = suite.expand()
    session = Session(console, req.launcher or Local(), Interpreter(code_path=user_code_path(configs, suite.source)))
    session.check(configs, suite.source, req.out)
    session.probe(configs, suite.source)
    args = {"suite": req.suite, "set": req.sets, "repeats": 1, "out": str(req.out), "profile_steps": req.steps,
            "memory_history": req.memory_history}
    with ExitStack() as held:  # one writer while it is written
        session.open(held, req.out, f"{suite.name}-profile-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}", suite, args,
                     configs)
        return _profile_run(req, session, configs)


def _profile_run(req: ProfileRequest, session: Session, configs: list[Config]) -> int:
    console, run_dir = session.console, session.run_dir
    console.print(f"profile {session.meta['run_id']}: {len(configs)} configs, {req.steps} profiled steps each -> "
                  f"{run_dir}", highlight=False)
    try:
        results = session.sweep(_jobs(configs, run_dir, req.steps, req.memory_history))
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (errors.Stopped)
        stop_message(e, f"the finished configs' profiles are in {run_dir}; a profile is not resumed: run the same "
                        "profile again for the rest")
        return stop_exit_code(e)
    session.finish()
    failed = sum(_show(r, run_dir, console) for r in results)
    profiled = sum(1 for r in results if r.get("profile", "files"))
    console.print(f"run directory: {run_dir}  (results.jsonl, profile/, logs/)", highlight=False)
    if req.report and any(r.ok for r in results):
        session.report(out=req.report_dir)
    if profiled == 0:
        console.print("[red]nothing was profiled[/red]", highlight=False)
    return EXIT_FAILED if failed or profiled == 0 else EXIT_OK


def _show(result: Result, run_dir: Path, console: Console) -> int:
    """Print one config's outcome; 1 if it failed (error, timeout, profiler failure)."""
    cid, status = result.config_id, result.status
    profile = result.profile or {}
    if status != "ok":
        where = f" (log: {run_dir / result.log})" if status in FAILED_STATUSES and result.log else ""
        console.print(f"{cid}: [bold]{status}[/bold]: {result.reason or 'no reason given'}{where}",
                      highlight=False, soft_wrap=True)
        oom = result.get("metrics", "oom")
        if isinstance(oom, dict):
            console.print("  " + oom_line(oom), highlight=False, soft_wrap=True)
            if oom.get("snapshot"):
                console.print(f"  memory history: {run_dir / oom['snapshot']}", highlight=False, soft_wrap=True)
        return EXIT_FAILED if status in FAILED_STATUSES else EXIT_OK
    history = profile.get("memory_history")
    if isinstance(history, dict):  # before what may end the listing
        console.print(f"{cid}: " + history_line(history, str(run_dir) + "/"), highlight=False, soft_wrap=True)
    if profile.get("error"):
        console.print(f"{cid}: [red]not profiled[/red]: {profile['error']}", highlight=False, soft_wrap=True)
        return EXIT_FAILED
    console.print(f"[bold]{cid}[/bold]: ok, {profile.get('profiler')}", highlight=False)
    console.print("  " + breakdown_line(result.metrics or {}), highlight=False, soft_wrap=True)
    if profile.get("reading"):
        console.print(f"  reading: {profile['reading']}", highlight=False, soft_wrap=True)
    elif profile.get("trace_breakdown_reason"):
        console.print(f"  no trace breakdown: {profile['trace_breakdown_reason']}", highlight=False, soft_wrap=True)
    for key, title in (("top_cpu", "self time on the CPU"), ("top_device", "self time on the GPU")):
        if profile.get(key):
            console.print(_ops_table(profile[key][:PRINTED_OPS], f"top operators by {title}"))
    for name, rel in (profile.get("files") or {}).items():
        console.print(f"  {name}: {run_dir / rel}", highlight=False, soft_wrap=True)
    return EXIT_OK


def breakdown_line(metrics: dict[str, Any]) -> str:
    b = metrics.get("breakdown")
    if not b:
        return f"breakdown: not measured ({metrics.get('breakdown_reason') or 'no phases'})"
    parts = ", ".join(f"{k.removesuffix('_ms')} {b[k]:.3g}" for k in ("data_ms", "forward_ms", "backward_ms",
                                                                       "optimizer_ms", "idle_ms", "overlap_ms")
                      if b.get(k) is not None and (k != "overlap_ms" or b[k] > 0))
    return f"breakdown (ms per step, {b['timing']}): {parts}; measured step {b['step_ms']:.3g}"


def _ops_table(rows: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=f"{title} (top {len(rows)})", title_justify="left")
    for col in ("operator", "calls", "self ms"):
        table.add_column(col, justify="left" if col == "operator" else "right", overflow="fold")
    for r in rows:
        table.add_row(r["name"], str(r["calls"]), f"{r['self_ms']:.3f}")
    return table
