"""``gpubench run``: validate everything, then make the run directory and sweep.

Nothing is written before the suite, the overrides and the plugins have been validated, so
bad input never leaves a run directory behind.
"""

from __future__ import annotations

import os
import shutil
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console

from gpubench.env import emulation_note
from gpubench.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    InputError,
    StorageError,
    note,
    stop_exit_code,
    stop_message,
    warn,
)
from gpubench.launch import Interpreter
from gpubench.results.result import Result
from gpubench.results.schema import FAILED_STATUSES
from gpubench.results.store import (
    NODE_FILE,
    RETRIED_STATUSES,
    RUN_FILE,
    SUPERSEDED_FILE,
    load_results,
    load_run,
    locked_run_dir,
    supersede,
)
from gpubench.runner.cost import Prices, resumed_prices, unpriced_lines
from gpubench.runner.history import Recording, RunHistory
from gpubench.runner.launcher import LauncherChoice
from gpubench.runner.local import Local
from gpubench.runner.mfu import load_peaks, peak_devices
from gpubench.runner.models import user_code_path
from gpubench.runner.nodes import Nodes
from gpubench.runner.progress import nothing_measured, print_summary, unmeasured_lines
from gpubench.runner.session import Session, load, resumed_choice, resumed_code_path
from gpubench.runner.sweep import plan, pre_resolve
from gpubench.suite import MAX_JOBS, Config, Suite, load_suite
from gpubench.telemetry.nvml import machine_findings, nvml_index


@dataclass
class RunRequest:
    suite: str | None
    out: Path
    sets: list[str] = field(default_factory=list)
    repeats: int | None = None
    resume: Path | None = None
    report: bool = True
    report_dir: Path | None = None  # where the report goes (None: beside the runs)
    calibrate: bool = True  # look up (or measure) device peaks for MFU
    prices: Prices | None = None  # --price: what each result's training cost
    nodes: Nodes = field(default_factory=Nodes)
    db: str | None = None  # record into this results history as results finish (None: no history)
    tags: dict[str, str] = field(default_factory=dict)  # --tag KEY=VALUE, kept in run.json and the history
    # --launcher NAME with its options (LAUNCHERS); None: on --resume the run's own, else local
    launcher: LauncherChoice | None = None
    max_jobs: int | None = None  # --max-jobs: the most config repeats the sweep may have (None: the suite's cap)
    retry_failed: bool = False  # --resume --retry-failed: run the error and timeout repeats again
    require_idle_gpu: bool = False  # --require-idle-gpu: refuse to measure on a GPU another process uses
    # where the workers import the user's code from (the Python API: the caller's directories);
    # None: the suite file's directory, where the suite names such code
    code_path: tuple[str, ...] | None = None


def _launcher_choice(req: RunRequest, run_dir: Path | None) -> LauncherChoice:
    """The launcher of this run: the one asked for, or on --resume the one the run was started
    under, given new options where asked."""
    if run_dir is None:
        return req.launcher or Local()
    return resumed_choice(req.launcher, load_run(run_dir).get("args") or {}, run_dir) or Local()


def _prepare(req: RunRequest, held: ExitStack) -> tuple[Suite, int, Path | None, list[Result]]:
    """(suite, repeats, run dir when resuming, results already there). Raises InputError. A
    resumed run directory is locked (``held``) before anything of it is read for writing."""
    cap = req.max_jobs or MAX_JOBS
    if req.resume is None:
        if req.retry_failed:
            raise InputError("--retry-failed: only with --resume RUN_DIR (it runs that run's failed configs again)")
        if req.suite is None:
            raise InputError("run: give a suite file (e.g. suites/quick.toml), or --resume RUN_DIR")
        repeats = req.repeats or 1
        return load(req.suite, req.sets, repeats, cap), repeats, None, []
    if req.nodes.multi:
        raise InputError(f"--resume {req.resume}: --nnodes cannot be combined with --resume; start the multi-node "
                         "run again on every node")
    meta = load_run(req.resume)
    if isinstance(meta.get("args"), dict) and meta["args"].get("nodes"):  # a bad args fails below, with its file
        raise InputError(f"--resume {req.resume}: that is a multi-node run; start it again on every node")
    made_by = next((what for key, what in (("ab_side", "gpubench ab"), ("profile_steps", "gpubench profile"))
                    if isinstance(meta.get("args"), dict) and meta["args"].get(key) is not None), None)
    if made_by is not None:  # its own command writes it, with its own rules (rounds, profiled steps)
        raise InputError(f"--resume {req.resume}: that run directory was written by {made_by}, which cannot be "
                         "resumed; run it again")
    if req.sets:
        raise InputError(f"--resume {req.resume}: --set cannot be combined with --resume; "
                         "the run keeps the settings it started with")
    try:
        suite = Suite.from_dict(meta["suite"], str(req.resume / RUN_FILE))
        if req.max_jobs is not None:
            suite = replace(suite, max_jobs=req.max_jobs)
        stored_repeats = meta["args"]["repeats"]
    except (KeyError, TypeError) as e:
        raise InputError(f"{req.resume / RUN_FILE}: missing or bad field {e}") from None
    if isinstance(stored_repeats, bool) or not isinstance(stored_repeats, int) or stored_repeats < 1:
        raise InputError(f"{req.resume / RUN_FILE}: args.repeats: expected an integer >= 1, got {stored_repeats!r}")
    if req.suite is not None and load_suite(req.suite, suite.max_jobs).name != suite.name:
        raise InputError(f"--resume {req.resume}: that run is of suite {suite.name!r}, not {req.suite!r}")
    if req.repeats is not None and req.repeats != stored_repeats:
        raise InputError(f"--resume {req.resume}: the run was started with --repeats {stored_repeats}")
    suite.check_size(stored_repeats)
    held.enter_context(locked_run_dir(req.resume))
    return suite, stored_repeats, req.resume, load_results(req.resume, repair=True)


def _resumed(run_dir: Path, configs: list[Config], existing: list[Result], retry_failed: bool) -> list[Result]:
    """The results a resume keeps, checked against the configs it will plan (their ids as this
    run names them, ``--nnodes`` included): results under other ids (an older gpubench named
    its configs otherwise) are refused, since the resume would run those configs again under
    new ids; with ``retry_failed`` the error and timeout results move to superseded.jsonl."""
    ids = {c.config_id for c in configs}
    strangers = sorted({r.config_id for r in existing} - ids)
    if strangers:
        raise InputError(f"--resume {run_dir}: its results name configs this suite does not have "
                         f"({strangers[0]}{f' and {len(strangers) - 1} more' if len(strangers) > 1 else ''}): "
                         "written by another gpubench version?; start a new run")
    if not retry_failed:
        return existing
    moved = supersede(run_dir, lambda r: r.status in RETRIED_STATUSES)
    note(f"--retry-failed: {moved} {' or '.join(RETRIED_STATUSES)} result(s) moved to {run_dir / SUPERSEDED_FILE}, "
         "to run again")
    return [r for r in existing if r.status not in RETRIED_STATUSES]


def used_gpus(configs: list[Config], gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPUs (of a fingerprint's NVML list) that the CUDA configs train on, on this node (each
    config's ``local_cuda_ordinals``), through CUDA_VISIBLE_DEVICES as CUDA numbers them."""
    ordinals = {o for c in configs for o in c.local_cuda_ordinals}  # this node's, not every node's
    uuids = [str(g.get("uuid", "")) for g in gpus]
    indices = {nvml_index(o, None, uuids, os.environ.get("CUDA_VISIBLE_DEVICES")) for o in ordinals}
    return [g for g in gpus if g.get("index") in indices]


def clean_machine_check(configs: list[Config], env: dict[str, Any], require_idle: bool) -> None:
    """Before a sweep with CUDA configs, the clean-machine check of the GPUs they train on (the
    fingerprint's NVML figures): a warning line per finding; with ``require_idle``, another
    process on one of them is an InputError listing the processes (nothing written yet)."""
    gpus = used_gpus(configs, env.get("gpus") or [])
    own = frozenset({os.getpid()})
    for line in machine_findings(gpus, own):
        warn(line)
    busy = [f"GPU {g['index']}: pid {p['pid']}" + (f" {p['name']}" if p.get("name") else "")
            for g in gpus for p in (g.get("state") or {}).get("processes") or [] if p["pid"] not in own]
    if require_idle and busy:
        raise InputError(f"--require-idle-gpu: other processes use the GPUs this sweep trains on ({'; '.join(busy)}); "
                         "wait for them to finish, or run without --require-idle-gpu to measure anyway")


def execute(req: RunRequest, console: Console) -> int:
    """Run (or resume) a sweep; the exit code. The run directory is locked while it is written."""
    with ExitStack() as held:
        return _execute(req, console, held)


def _execute(req: RunRequest, console: Console, held: ExitStack) -> int:
    nodes = req.nodes.check()
    suite, repeats, run_dir, existing = _prepare(req, held)
    choice = _launcher_choice(req, run_dir)
    # every node expands the same suite: the same configs in the same order
    configs = [replace(c, nnodes=choice.nnodes(nodes)) for c in suite.expand()]
    session = Session(console, choice, Interpreter(code_path=_code_path(req, run_dir, configs, suite.source)), nodes)
    session.check(configs, suite.source, run_dir or req.out, fresh=run_dir is None)
    prices = req.prices
    if run_dir is not None:
        existing = _resumed(run_dir, configs, existing, req.retry_failed)
        stored = Prices.from_dict((load_run(run_dir).get("args") or {}).get("prices"), str(run_dir / RUN_FILE))
        prices = resumed_prices(req.prices, stored, run_dir)
    history = RunHistory(req.db) if req.db is not None and nodes.node_rank == 0 else None
    jobs = plan(configs, repeats, {(r.config_id, r.repeat) for r in existing})
    session.probe(list({job.config.config_id: job.config for job in jobs}.values()), suite.source, jobs)
    runnable = [job.config for job in jobs if pre_resolve(job.config, session.probes) is None]
    if (emulated := emulation_note(runnable, session.env)) is not None:
        note(emulated)
    if session.local:
        clean_machine_check(runnable, session.env, req.require_idle_gpu)
    elif req.require_idle_gpu:
        warn(f"--require-idle-gpu: the jobs run on other machines ({choice.name}), whose GPUs are not read from here; "
             "each result's fingerprint has its node's GPU state")
    # only node 0 writes results, so only node 0 needs the peaks (a calibration on the others
    # would only delay their first rendezvous)
    peaks = (load_peaks(peak_devices(runnable), console)
             if req.calibrate and nodes.node_rank == 0 and session.local else {})
    if run_dir is None:
        args: dict[str, Any] = {"suite": req.suite, "set": req.sets, "repeats": repeats, "out": str(req.out)}
        if prices is not None:
            args["prices"] = prices.to_dict()
        if nodes.multi:
            args["nodes"] = nodes.to_dict()
        session.open(held, req.out, f"{suite.name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}", suite, args, configs,
                     req.tags, tail=f"-node{nodes.node_rank}" if nodes.node_rank else "")
    else:
        session.reopen(held, run_dir, locked=True)
    where = f" (node {nodes.node_rank} of {nodes.nnodes})" if nodes.multi else ""
    console.print(f"run {session.meta['run_id']}{where}: {len(configs)} configs x {repeats} repeat(s), {len(jobs)} to "
                  f"run -> {session.run_dir}", highlight=False)
    recording = Recording(history, session.meta, existing, req.tags, str(session.run_dir))
    try:
        recording.begin(known=session.local or bool(session.meta.get("env")))
    except BaseException:
        if run_dir is None:  # a history that cannot be written at the start (a locked database): no run is left
            shutil.rmtree(session.run_dir, ignore_errors=True)
        raise
    try:
        new = session.sweep(jobs, recording.record, earlier=existing, peaks=peaks, prices=prices)
    except StorageError:  # the machine's failure, not a config's: stop, nothing recorded for that job
        recording.late()
        raise
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (errors.Stopped)
        recording.late()
        stop_message(e, f"finished configs are in {session.run_dir}/results.jsonl"
                        f"{' and the history (the run marked incomplete)' if recording.live is not None else ''}; "
                        f"continue with: gpubench run --resume {session.run_dir}")
        return stop_exit_code(e)
    recording.late()
    if session.cancelled:
        console.print(f"[yellow]{choice.cancelled_line(session.cancelled)}[/yellow] without a result; finished "
                      f"configs are in {session.run_dir}/results.jsonl; continue with: gpubench run --resume "
                      f"{session.run_dir}", highlight=False, soft_wrap=True)
        return EXIT_INTERRUPTED
    session.finish()
    recording.finish()
    for line in unpriced_lines(new, prices) if prices is not None else []:
        warn(line)
    return _conclude(new if nodes.node_rank > 0 else existing + new, session, req)


def _code_path(req: RunRequest, run_dir: Path | None, configs: list[Config], source: str) -> tuple[str, ...]:
    """Where the workers import the user's own code (factories, batch and loss functions) from:
    the suite's directory, or the caller's (the Python API); a resumed run keeps its own."""
    stored = resumed_code_path(load_run(run_dir).get("args") or {}) if run_dir is not None else None
    if stored is not None:
        return stored
    return req.code_path if req.code_path is not None else user_code_path(configs, source)


def _conclude(results: list[Result], session: Session, req: RunRequest) -> int:
    """The summary of a finished run, its report, and its exit code; on node r > 0 of a multi-node
    run, the node's own outcome of each config (node 0 has the results and the report)."""
    console, run_dir, node = session.console, session.run_dir, session.nodes.node_rank > 0
    if not node:
        print_summary(console, results)
    for line in unmeasured_lines(results):
        console.print(line, highlight=False, soft_wrap=True)
    failed = [r for r in results if r.status in FAILED_STATUSES]
    where = (f"this node's outcomes: {run_dir / NODE_FILE}; the results and the report are on node 0" if node
             else f"results: {run_dir / 'results.jsonl'}")
    console.print(where + (f"  ([red]{len(failed)} failed[/red])" if failed else ""), highlight=False)
    if node:
        return EXIT_FAILED if failed else EXIT_OK
    if req.report:
        session.report(out=req.report_dir)
    if (nothing := nothing_measured(results)) is not None:
        console.print(f"[red]{nothing}[/red]", highlight=False, soft_wrap=True)
    return EXIT_FAILED if failed or nothing else EXIT_OK
