"""The lifecycle of a measuring command's run directory, written once for every command.

Every command that measures (``run``, ``ab``, ``advise``, ``profile``, ``find-batch``; ``bisect``
through ``ab``) goes through the same twelve steps, here and nowhere else: load the suite →
expand it → check the data → check the output directory → probe the frameworks → check the
models → fingerprint → a new run directory → lock it → run the jobs → finish the run directory
→ write the report. A ``Session`` holds one run directory through them, with the launcher the
user chose (``--launcher``: LAUNCHERS), so that every command runs wherever ``run`` runs: on
this machine or as Slurm jobs. Each command keeps only its own policy (which jobs, in what
order, what it decides from their results).

A remote launcher's jobs run on other machines: their frameworks, models and device are
checked by each job's worker where it runs, and the run's fingerprint is that of the node its
first job ran on (each result carries its own node's).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console

from gpubench.backends.base import ProbeInfo
from gpubench.env import fingerprint
from gpubench.errors import InputError, warn
from gpubench.launch import Interpreter, TurnEnds
from gpubench.provenance import provenance
from gpubench.results.outputs import check_output_dir
from gpubench.results.result import Result
from gpubench.results.schema import SCHEMA_VERSION
from gpubench.results.store import RUN_FILE, create_run_dir, load_run, locked_run_dir, write_json_atomic
from gpubench.runner.cost import Prices
from gpubench.runner.job import Job
from gpubench.runner.launcher import LaunchContext, LauncherChoice
from gpubench.runner.local import Local
from gpubench.runner.models import check_models
from gpubench.runner.nodes import Nodes
from gpubench.runner.probe import probe
from gpubench.runner.progress import SweepDisplay
from gpubench.runner.slurm import SlurmOptions
from gpubench.runner.sweep import Callback, FinishCallback, run_sweep
from gpubench.suite import Config, Suite, load_suite

# --launcher NAME: the launchers, by name (a run.json's args keep a launcher's options under its
# name, so that a resumed run continues under it). A new launcher (Kubernetes, say) is a
# LauncherChoice and its JobLauncher (gpubench.runner.launcher), named here and nowhere else.
LAUNCHERS: dict[str, type[LauncherChoice]] = {"local": Local, "slurm": SlurmOptions}
RUN_SUFFIX_CHARS = 6  # hex digits of the run's uuid in its id: 16.7 million ids a second


def resumed_choice(given: LauncherChoice | None, args: dict[str, Any], run_dir: Path) -> LauncherChoice | None:
    """The launcher a resumed run goes on under: the one it was started with (kept in its run.json's
    ``args`` under its name), given new options where ``given`` is one of its kind; ``given``
    (None: this machine) for a run started without one. InputError for another launcher."""
    stored = next((cls.from_stored(args[name]) for name, cls in LAUNCHERS.items()
                   if isinstance(args.get(name), dict)), None)
    if stored is None or given is None:
        return stored or given
    if type(given) is not type(stored):  # the configs' ids (nnodes) and jobs are the started launcher's
        raise InputError(f"--resume {run_dir}: the run was started with --launcher {stored.name}, not "
                         f"{given.name}; resume it under {stored.name}")
    return given.resumed(stored, run_dir)


def resumed_code_path(args: dict[str, Any]) -> tuple[str, ...] | None:
    """Where a resumed run's workers import the user's own code from: the directories its run.json's
    ``args`` kept (``Session.open`` writes them), or None where it kept none."""
    stored = args.get("code_path")
    return tuple(str(p) for p in stored) if isinstance(stored, list) else None


def load(suite: str, sets: list[str], repeats: int = 1, cap: int | None = None) -> Suite:
    """Step 1: the suite file with the command line's ``--set``, its size checked (InputError)."""
    loaded = (load_suite(suite) if cap is None else load_suite(suite, cap)).with_overrides(sets)
    loaded.check_size(repeats)
    return loaded


def check_data(configs: list[Config], source: str) -> None:
    """MNIST configs need readable IDX files: check them before anything is written."""
    from gpubench.workloads.mnist import IdxError, load_mnist

    for data_dir in sorted({c.data_dir for c in configs if c.dataset == "mnist"}):
        if not data_dir:
            raise InputError(f"{source}: data_dir: dataset 'mnist' needs data_dir, the directory of the MNIST IDX "
                             "files")
        try:
            load_mnist(data_dir)
        except IdxError as e:
            raise InputError(f"{source}: data_dir: {e}") from None


def probe_frameworks(configs: list[Config], console: Console, interpreter: Interpreter = Interpreter(),
                     label: str = "") -> dict[str, ProbeInfo]:
    """Probe every framework of the configs, in parallel child processes."""
    names = sorted({c.framework for c in configs})
    if not names:
        return {}
    with console.status(f"probing {', '.join(names)}..."), ThreadPoolExecutor(len(names)) as pool:
        probes = dict(zip(names, pool.map(lambda n: probe(n, interpreter), names)))
    for name, p in probes.items():
        console.print(f"{label}{name}: " + (f"{p.version}, devices: {', '.join(p.device_names())}" if p.available
                                            else f"[yellow]unavailable[/yellow]: {p.reason}"), highlight=False)
    return probes


def new_run_dir(out: Path, run_id: str, suite: Suite, args: dict[str, Any], configs: list[Config],
                env: dict[str, Any], tags: dict[str, str] | None = None,
                dir_name: str | None = None, tail: str = "") -> tuple[Path, dict[str, Any]]:
    """Make a run directory and its run.json (only once all input has been validated).

    Every run is unique from its creation: run.json carries a random ``run_uuid`` (the key the
    history records it by), and the run id is ``run_id`` with the first characters of that uuid
    appended (then ``tail``: a node's ``-node<r>``), so that runs of one suite started in the same
    second (CI jobs on one runner) never share an id. The directory is named after the run id,
    or ``dir_name`` (an A/B's sides)."""
    now = datetime.now(timezone.utc)
    run_uuid = uuid.uuid4().hex
    if dir_name is None:
        run_dir = create_run_dir(out, f"{run_id}-{run_uuid[:RUN_SUFFIX_CHARS]}{tail}")
        run_id = run_dir.name
    else:
        run_dir = create_run_dir(out, dir_name)
    meta = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "run_uuid": run_uuid,
            "created_at": now.isoformat(timespec="seconds"), "suite": suite.to_dict(), "args": args,
            "configs": len(configs), "env": env, "provenance": provenance(), "tags": tags or {}, "completed": False}
    write_json_atomic(run_dir / RUN_FILE, meta)
    return run_dir, meta


def write_report(run_dirs: list[Path], console: Console, out: Path | None = None) -> None:
    """Write the report; a failure here is reported but never costs the results."""
    from gpubench.report.build import build_report

    try:
        report = build_report(run_dirs, out)
    except Exception as e:  # noqa: BLE001 - the run's results are safe on disk whatever happens here
        warn(f"report not written: {type(e).__name__}: {e}; retry with: gpubench report "
             f"{' '.join(map(str, run_dirs))}")
        return
    for warning in report.warnings:  # as `gpubench report` shows them
        warn(warning)
    console.print(f"report: {report.index}", highlight=False)


def report_beside(run_dir: Path) -> Path:
    """Where a run's report goes when no --report-dir is given: ``reports/<its directory's name>``
    beside the directory the runs are in (runs/X: reports/X; --out /data/runs: /data/reports/X)."""
    return run_dir.parent.parent / "reports" / run_dir.name


@dataclass
class Session:
    """One run directory through the lifecycle, under the launcher the user chose.

    ``interpreter``: how the workers start (the interpreter and where they import the user's
    code from); ``label``: what the probe lines begin with (an A/B's side). Set as the steps
    go: ``probes`` and ``env`` (this machine's; empty for a remote launcher), ``run_dir`` and
    ``meta`` (its run.json), ``cancelled`` (jobs cancelled without an outcome)."""

    console: Console
    choice: LauncherChoice = field(default_factory=Local)
    interpreter: Interpreter = field(default_factory=Interpreter)
    nodes: Nodes = field(default_factory=Nodes)
    label: str = ""
    probes: dict[str, ProbeInfo] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    run_dir: Path = Path(".")
    meta: dict[str, Any] = field(default_factory=dict)
    cancelled: int = 0

    @property
    def local(self) -> bool:
        return not self.choice.remote

    def check(self, configs: list[Config], source: str, out: Path, fresh: bool = True) -> None:
        """Steps 3 and 4 (with what the launcher refuses): the data, and the directory a new run
        goes to (``fresh``; a resumed run's is checked by its lock). InputError, nothing written."""
        check_data(configs, source)
        self.choice.check(configs, out, self.nodes)
        if fresh:
            check_output_dir(out, "--out")

    def probe(self, configs: list[Config], source: str, jobs: list[Job] | None = None) -> None:
        """Steps 5 to 7: the frameworks probed, the models built once in a child (each side's with
        its own code), this machine's fingerprint; where the jobs run elsewhere, the launcher's
        own test of them (a scheduler's test submission) instead. ``configs``: those that will
        run (none: nothing probed)."""
        if self.local and configs:
            self.probes = probe_frameworks(configs, self.console, self.interpreter, self.label)
            where = (f"{source} ({self.label.strip()}: {', '.join(self.interpreter.code_path)})"
                     if self.label and self.interpreter.code_path else source)
            check_models(configs, where, self.interpreter,
                         skip_frameworks={name for name, p in self.probes.items() if not p.available})
        self.choice.check_jobs(jobs if jobs is not None else [Job(c, 0) for c in configs], self.interpreter)
        self.env = fingerprint({k: p.to_dict() for k, p in self.probes.items()}) if self.local else {}

    def open(self, held: ExitStack, out: Path, run_id: str, suite: Suite, args: dict[str, Any],
             configs: list[Config], tags: dict[str, str] | None = None, dir_name: str | None = None,
             tail: str = "") -> None:
        """Steps 8 and 9: the run directory and its run.json (``args`` with where the workers import
        the user's code from and the launcher's options, which a resume keeps), locked for as long
        as ``held`` is."""
        args = dict(args)
        if self.interpreter.code_path:
            args["code_path"] = list(self.interpreter.code_path)
        if (kept := self.choice.stored()) is not None:
            args[self.choice.name] = kept
        self.run_dir, self.meta = new_run_dir(out, run_id, suite, args, configs, self.env, tags, dir_name, tail)
        held.enter_context(locked_run_dir(self.run_dir))

    def reopen(self, held: ExitStack, run_dir: Path, locked: bool = False) -> None:
        """A run directory continued (``--resume``): locked (unless the caller holds it already),
        its run.json read and the resume noted in it."""
        if not locked:
            held.enter_context(locked_run_dir(run_dir))
        self.run_dir, self.meta = run_dir, load_run(run_dir)
        self.meta.setdefault("resumed_at", []).append(datetime.now(timezone.utc).isoformat(timespec="seconds"))
        write_json_atomic(run_dir / RUN_FILE, self.meta)

    def run(self, jobs: list[Job], on_start: Callback | None = None, on_finish: FinishCallback | None = None,
            earlier: list[Result] | None = None, peaks: dict[str, dict[str, Any]] | None = None,
            note: Callable[[str], None] = lambda line: None, turns: TurnEnds | None = None,
            prices: Prices | None = None) -> list[Result]:
        """Step 10: the jobs, through the launcher (gpubench.runner.sweep.run_sweep), each result
        appended to the run as it ends. A remote run takes its fingerprint from its first result
        that has one (before ``on_finish`` hears of it). ``turns``: a lockstep side's pipe end."""
        interpreter = self.interpreter if turns is None else replace(self.interpreter, turns=turns)
        runner = self.choice.start(LaunchContext(run_dir=self.run_dir, interpreter=interpreter, probes=self.probes,
                                                 nodes=self.nodes, earlier=list(earlier or []), total=len(jobs),
                                                 note=note))

        def finished(k: int, job: Job, result: Result) -> None:
            if not self.local and not self.meta.get("env") and result.env:  # the first job's node's
                self.meta["env"] = result.env
                write_json_atomic(self.run_dir / RUN_FILE, self.meta)
            if on_finish is not None:
                on_finish(k, job, result)

        try:
            return run_sweep(jobs, runner, self.run_dir, self.meta["run_id"], self.env, on_start, finished, peaks,
                             self.nodes.node_rank, prices)
        finally:
            self.cancelled += runner.cancelled

    def one(self, job: Job, note: Callable[[str], None] = lambda line: None,
            turns: TurnEnds | None = None) -> Result:
        """``run`` of one job, for a command that decides after each (ab's rounds); a job cancelled
        outside gpubench (``scancel``) stops the command as Ctrl-C does, what finished kept."""
        results = self.run([job], note=note, turns=turns)
        if not results:
            warn(f"{self.choice.cancelled_line(1)}: {job.name} has no result")
            raise KeyboardInterrupt
        return results[0]

    def sweep(self, jobs: list[Job], on_finish: Callable[[Result], None] = lambda result: None,
              earlier: list[Result] | None = None, peaks: dict[str, dict[str, Any]] | None = None,
              prices: Prices | None = None) -> list[Result]:
        """``run`` with the progress display: a bar on a terminal, a line per finished job."""
        with SweepDisplay(self.console, len(jobs)) as display:
            def finished(k: int, job: Job, result: Result) -> None:
                display.finished(k, job, result)
                on_finish(result)
            return self.run(jobs, display.started, finished, earlier, peaks, display.note, prices=prices)

    def finish(self) -> None:
        """Step 11: the run directory marked completed, with when."""
        self.meta.update(completed=True, finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        write_json_atomic(self.run_dir / RUN_FILE, self.meta)

    def report(self, run_dirs: list[Path] | None = None, out: Path | None = None) -> None:
        """Step 12: the report of this run directory (or of ``run_dirs`` side by side), in ``out``
        (--report-dir) or beside the runs (report_beside)."""
        write_report(run_dirs or [self.run_dir], self.console, out or report_beside(self.run_dir))
