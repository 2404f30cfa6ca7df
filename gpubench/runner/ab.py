"""``gpubench ab``: same-job A/B, the most robust way to gate in CI.

Every config runs alternately under a baseline and a candidate environment (two Python
interpreters, or two checkouts of a project, or both) on the same machine: A B, then B A in
the next round, and so on. Drift of the machine (thermal, other tenants, clock boosts)
lands on both sides alike, which a comparison against a stored baseline from another day
cannot promise. The two sides go to two run directories, which are then compared by the
regression gate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from gpubench.env import fingerprint
from gpubench.errors import InputError, warn
from gpubench.gate import render
from gpubench.gate.compare import compare, fingerprint_differences, gate_options, repeats_for
from gpubench.launch import Launcher
from gpubench.results.outputs import check_output_dir, check_output_file, write_output
from gpubench.results.result import Result
from gpubench.results.schema import FAILED_STATUSES
from gpubench.runner.progress import SweepDisplay
from gpubench.runner.run import check_data, finish_run_dir, new_run_dir, probe_frameworks, write_report
from gpubench.runner.sweep import plan, run_jobs
from gpubench.suite import MAX_BATCH, load_suite

SIDES = ("baseline", "candidate")


@dataclass
class ABRequest:
    suite: str
    baseline: Launcher
    candidate: Launcher
    out: Path = Path("runs")
    sets: list[str] = field(default_factory=list)
    repeats: int = 10
    threshold: str = "3%"
    noise_floor: str = "1%"
    alpha: float = 0.01
    metric: str = "throughput"
    markdown: Path | None = None
    report: bool = True
    correction: str = "bonferroni"


def _check_python(launcher: Launcher, side: str) -> None:
    import shutil

    if shutil.which(launcher.python) is None and not Path(launcher.python).is_file():
        raise InputError(f"--{side}-python {launcher.python}: no such interpreter")
    import os

    for part in (launcher.pythonpath or "").split(os.pathsep) if launcher.pythonpath else []:
        if not Path(part).is_dir():
            raise InputError(f"--{side}-path {launcher.pythonpath}: no such directory: {part}")


def execute_ab(req: ABRequest, console: Console) -> int:
    options = gate_options(req.threshold, req.noise_floor, req.alpha, req.metric, req.correction)  # before any run
    suite = load_suite(req.suite).with_overrides(req.sets)
    configs = suite.expand()
    check_data(configs, suite.source)
    searched = [c.config_id for c in configs if c.batch_size == MAX_BATCH]
    if searched:  # each side's search could settle on another batch near the memory limit
        raise InputError(f"{suite.source}: batch_size: \"max\" is not for gpubench ab, whose two sides must train "
                         f"the same batch ({searched[0]}); find it with gpubench find-batch and give the number")
    needed = repeats_for(req.alpha, len(configs), options.correction)
    if req.repeats < needed:
        raise InputError(f"--repeats {req.repeats}: comparing {len(configs)} config(s) at alpha {req.alpha:g} needs at "
                         f"least {needed} repeats per side")
    launchers = {"baseline": req.baseline, "candidate": req.candidate}
    for side, launcher in launchers.items():
        _check_python(launcher, side)
    check_output_dir(req.out, "--out")
    check_output_file(req.markdown, "--markdown")
    probes = {side: probe_frameworks(configs, console, launchers[side], label=f"{side} ") for side in SIDES}
    envs = {side: fingerprint({k: p.to_dict() for k, p in probes[side].items()}) for side in SIDES}
    for d in fingerprint_differences(envs["baseline"], envs["candidate"], {c.framework for c in configs}):
        warn(f"environments differ (this may be the change under test): {d}")

    stamp = f"{suite.name}-ab-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    root = req.out / stamp
    dirs, metas = {}, {}
    for side in SIDES:
        args = {"suite": req.suite, "set": req.sets, "repeats": req.repeats, "out": str(req.out), "ab_side": side,
                "python": launchers[side].python, "pythonpath": launchers[side].pythonpath}
        dirs[side], metas[side] = new_run_dir(root, side, suite, args, configs, envs[side])
    jobs = plan(configs, req.repeats)
    console.print(f"A/B {stamp}: {len(configs)} configs x {req.repeats} repeats x 2 sides -> {root}", highlight=False)
    results: dict[str, list[Result]] = {side: [] for side in SIDES}
    with SweepDisplay(console, 2 * len(jobs)) as display:
        k = 0
        for job in jobs:
            order = SIDES if job.repeat % 2 == 0 else SIDES[::-1]  # A B, then B A, ...
            for side in order:
                display.started(k, job)
                (result,) = run_jobs([job], dirs[side], metas[side]["run_id"], envs[side], probes[side],
                                     launcher=launchers[side])
                results[side].append(result)
                display.finished(k, job, result)
                k += 1
    for side in SIDES:
        finish_run_dir(dirs[side], metas[side])
    failed = [(side, r) for side in SIDES for r in results[side] if r.status in FAILED_STATUSES]
    for side, r in failed:
        console.print(f"[red]{r.status}[/red] ({side}) {r.config_id}: {r.reason}", highlight=False)
    labels = ("baseline", "candidate")
    comparison = compare(results["baseline"], results["candidate"], options.metric, options.threshold,
                         options.noise_floor, options.alpha, labels, options.correction)
    reproduce = render.compare_command(str(dirs["baseline"]), str(dirs["candidate"]), options, force=True)
    power, triaged = render.show(console, comparison, labels, results["baseline"], results["candidate"], reproduce)
    if req.markdown:
        write_output(req.markdown, render.markdown(comparison, labels, power, triaged), "--markdown")
    if req.report:
        write_report([dirs["baseline"], dirs["candidate"]], console, out=Path("reports") / stamp)
    console.print(f"run directories: {dirs['baseline']} {dirs['candidate']}", highlight=False)
    return 1 if comparison.regressed or failed else 0
