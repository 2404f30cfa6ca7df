"""``gpubench run``: validate everything, then make the run directory and sweep.

Nothing is written before the suite, the overrides and the plugins have been validated, so
bad input never leaves a run directory behind.
"""

from __future__ import annotations

import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console

from gpubench.backends.base import ProbeInfo
from gpubench.env import emulation_note, fingerprint
from gpubench.errors import InputError, StorageError, note, stop_exit_code, stop_message, warn
from gpubench.launch import Launcher
from gpubench.provenance import provenance
from gpubench.results.outputs import check_output_dir
from gpubench.results.result import Result
from gpubench.results.schema import FAILED_STATUSES, SCHEMA_VERSION
from gpubench.results.store import (
    NODE_FILE,
    RETRIED_STATUSES,
    RUN_FILE,
    SUPERSEDED_FILE,
    create_run_dir,
    load_results,
    load_run,
    locked_run_dir,
    supersede,
    write_json_atomic,
)
from gpubench.runner.history import RunHistory
from gpubench.runner.launcher import LaunchContext, LauncherChoice
from gpubench.runner.local import Local
from gpubench.runner.mfu import load_peaks, peak_devices
from gpubench.runner.models import check_models, user_code_path
from gpubench.runner.nodes import Nodes
from gpubench.runner.probe import probe
from gpubench.runner.progress import SweepDisplay, nothing_measured, print_summary, unmeasured_lines
from gpubench.runner.slurm import SlurmOptions
from gpubench.runner.sweep import plan, pre_resolve, run_sweep
from gpubench.suite import MAX_JOBS, Config, Suite, load_suite
from gpubench.telemetry.nvml import machine_findings, nvml_index

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
# gpubench run --launcher NAME: the launchers, by name (a run.json's args keep a launcher's
# options under its name, so that a resumed run continues under it)
LAUNCHERS: dict[str, type[LauncherChoice]] = {"local": Local, "slurm": SlurmOptions}
RUN_SUFFIX_CHARS = 6  # hex digits of the run's uuid in its id: 16.7 million ids a second


@dataclass
class RunRequest:
    suite: str | None
    out: Path
    sets: list[str] = field(default_factory=list)
    repeats: int | None = None
    resume: Path | None = None
    report: bool = True
    calibrate: bool = True  # look up (or measure) device peaks for MFU
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


def probe_frameworks(configs: list[Config], console: Console, launcher: Launcher = Launcher(),
                     label: str = "") -> dict[str, ProbeInfo]:
    """Probe every framework of the sweep, in parallel child processes."""
    names = sorted({c.framework for c in configs})
    with console.status(f"probing {', '.join(names)}..."), ThreadPoolExecutor(len(names)) as pool:
        probes = dict(zip(names, pool.map(lambda n: probe(n, launcher), names)))
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
    meta = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "run_uuid": run_uuid,
        "created_at": now.isoformat(timespec="seconds"),
        "suite": suite.to_dict(),
        "args": args,
        "configs": len(configs),
        "env": env,
        "provenance": provenance(),
        "tags": tags or {},
        "completed": False,
    }
    write_json_atomic(run_dir / RUN_FILE, meta)
    return run_dir, meta


def finish_run_dir(run_dir: Path, meta: dict[str, Any]) -> None:
    meta["completed"] = True
    meta["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_json_atomic(run_dir / RUN_FILE, meta)


def _launcher_choice(req: RunRequest, run_dir: Path | None) -> LauncherChoice:
    """The launcher of this run: the one asked for, or on --resume the one the run was started
    under (kept in run.json's args under its name), given new options where asked."""
    args = (load_run(run_dir).get("args") or {}) if run_dir is not None else {}
    stored = next((cls.from_stored(args[name]) for name, cls in LAUNCHERS.items()
                   if isinstance(args.get(name), dict)), None)
    if stored is None:
        return req.launcher or Local()
    if req.launcher is None:
        return stored
    assert run_dir is not None
    if type(req.launcher) is not type(stored):  # the configs' ids (nnodes) and jobs are the started launcher's
        raise InputError(f"--resume {run_dir}: the run was started with --launcher {stored.name}, not "
                         f"{req.launcher.name}; resume it under {stored.name}")
    return req.launcher.resumed(stored, run_dir)


def _prepare(req: RunRequest, held: ExitStack) -> tuple[Suite, int, Path | None, list[Result]]:
    """(suite, repeats, run dir when resuming, results already there). Raises InputError. A
    resumed run directory is locked (``held``) before anything of it is read for writing."""
    cap = req.max_jobs or MAX_JOBS
    if req.resume is None:
        if req.retry_failed:
            raise InputError("--retry-failed: only with --resume RUN_DIR (it runs that run's failed configs again)")
        if req.suite is None:
            raise InputError("run: give a suite file (e.g. suites/quick.toml), or --resume RUN_DIR")
        suite = load_suite(req.suite, cap).with_overrides(req.sets)
        repeats = req.repeats or 1
        suite.check_size(repeats)
        return suite, repeats, None, []
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
    existing = load_results(req.resume, repair=True)
    return suite, stored_repeats, req.resume, existing


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
    check_data(configs, suite.source)
    choice.check(configs, run_dir or req.out, nodes)
    if run_dir is not None:
        existing = _resumed(run_dir, configs, existing, req.retry_failed)
    if run_dir is None:
        check_output_dir(req.out, "--out")
    history = RunHistory(req.db) if req.db is not None and nodes.node_rank == 0 else None
    done = {(r.config_id, r.repeat) for r in existing}
    jobs = plan(configs, repeats, done)
    # the user's own code (factories, batch and loss functions) is imported from the suite's
    # directory; a resumed run keeps the directory it started with
    stored_path = (load_run(run_dir).get("args") or {}).get("code_path") if run_dir is not None else None
    code_path = (tuple(str(p) for p in stored_path) if isinstance(stored_path, list)
                 else req.code_path if req.code_path is not None else user_code_path(configs, suite.source))
    launcher = Launcher(code_path=code_path)
    # a remote launcher's jobs run on other machines: the frameworks, devices and models are
    # theirs, checked by each job's worker where it runs
    local = not choice.remote
    probes = probe_frameworks(configs, console, launcher) if jobs and local else {}
    if jobs and local:
        check_models([job.config for job in jobs], suite.source, launcher,
                     skip_frameworks={name for name, p in probes.items() if not p.available})
    choice.check_jobs(jobs, launcher)
    # a remote run's fingerprint is that of the node its first job ran on (each result has its
    # own node's), written into run.json as that job ends
    env = fingerprint({k: p.to_dict() for k, p in probes.items()}) if local else {}
    runnable = [job.config for job in jobs if pre_resolve(job.config, probes) is None]
    if (emulated := emulation_note(runnable, env)) is not None:
        note(emulated)
    if local:
        clean_machine_check(runnable, env, req.require_idle_gpu)
    elif req.require_idle_gpu:
        warn(f"--require-idle-gpu: the jobs run on other machines ({choice.name}), whose GPUs are not read from here; "
             "each result's fingerprint has its node's GPU state")
    # only node 0 writes results, so only node 0 needs the peaks (a calibration on the others
    # would only delay their first rendezvous)
    peaks = (load_peaks(peak_devices(runnable), console)
             if req.calibrate and nodes.node_rank == 0 and local else {})
    now = datetime.now(timezone.utc)
    fresh = run_dir is None
    if run_dir is None:
        args: dict[str, Any] = {"suite": req.suite, "set": req.sets, "repeats": repeats, "out": str(req.out)}
        if code_path:
            args["code_path"] = list(code_path)
        if nodes.multi:
            args["nodes"] = nodes.to_dict()
        if (kept := choice.stored()) is not None:
            args[choice.name] = kept
        node = f"-node{nodes.node_rank}" if nodes.node_rank else ""
        run_dir, meta = new_run_dir(req.out, f"{suite.name}-{now:%Y%m%d-%H%M%S}", suite, args, configs, env,
                                    req.tags, tail=node)
        held.enter_context(locked_run_dir(run_dir))
    else:
        meta = load_run(run_dir)
        meta.setdefault("resumed_at", []).append(now.isoformat(timespec="seconds"))
        write_json_atomic(run_dir / RUN_FILE, meta)
    run_id = meta["run_id"]
    where = f" (node {nodes.node_rank} of {nodes.nnodes})" if nodes.multi else ""
    console.print(f"run {run_id}{where}: {len(configs)} configs x {repeats} repeat(s), {len(jobs)} to run "
                  f"-> {run_dir}", highlight=False)
    # a new remote run is recorded once its fingerprint is known (its first job's node's), or at
    # its end if no job's worker told it
    try:
        recorder = (history.begin(meta, existing, req.tags, str(run_dir))
                    if history is not None and (meta.get("env") or local) else None)
    except BaseException:
        if fresh:  # a history that cannot be written at the start (a locked database): no run is left behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    so_far: list[Result] = []

    def record_late() -> None:
        nonlocal recorder
        if history is not None and recorder is None and (existing or so_far):
            recorder = history.begin(meta, existing + so_far, req.tags, str(run_dir), started=True)

    cancelled = 0
    try:
        with SweepDisplay(console, len(jobs)) as display:
            def finished(k: int, job: Any, result: Result) -> None:
                display.finished(k, job, result)
                so_far.append(result)
                if not local and not meta.get("env") and result.env:  # the first job's node's
                    meta["env"] = result.env
                    write_json_atomic(run_dir / RUN_FILE, meta)
                    record_late()  # this result with the earlier ones
                elif recorder is not None:
                    recorder.record(result)
            runner = choice.start(LaunchContext(run_dir=run_dir, launcher=launcher, probes=probes, nodes=nodes,
                                                earlier=list(existing), total=len(jobs), note=display.note))
            new = run_sweep(jobs, runner, run_dir, run_id, env, display.started, finished, peaks, nodes.node_rank)
            cancelled = runner.cancelled
    except StorageError:  # the machine's failure, not a config's: stop, nothing recorded for that job
        record_late()
        raise
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (errors.Stopped)
        record_late()
        stop_message(e, f"finished configs are in {run_dir}/results.jsonl"
                        f"{' and the history (the run marked incomplete)' if recorder is not None else ''}; "
                        f"continue with: gpubench run --resume {run_dir}")
        return stop_exit_code(e)
    record_late()
    if cancelled:
        console.print(f"[yellow]{choice.cancelled_line(cancelled)}[/yellow] without a result; finished "
                      f"configs are in {run_dir}/results.jsonl; continue with: gpubench run --resume {run_dir}",
                      highlight=False, soft_wrap=True)
        return EXIT_INTERRUPTED
    finish_run_dir(run_dir, meta)
    if recorder is not None:
        recorder.finish(meta["finished_at"])
    results = existing + new
    if nodes.node_rank > 0:
        return _node_summary(new, run_dir, console)
    print_summary(console, results)
    for line in unmeasured_lines(results):
        console.print(line, highlight=False, soft_wrap=True)
    failed = [r for r in results if r.status in FAILED_STATUSES]
    console.print(f"results: {run_dir / 'results.jsonl'}" + (f"  ([red]{len(failed)} failed[/red])" if failed else ""),
                  highlight=False)
    if req.report:
        write_report([run_dir], console)
    if (nothing := nothing_measured(results)) is not None:
        console.print(f"[red]{nothing}[/red]", highlight=False, soft_wrap=True)
    return EXIT_FAILED if failed or nothing else EXIT_OK


def _node_summary(outcomes: list[Result], run_dir: Path, console: Console) -> int:
    """Node r > 0 of a multi-node run: its own outcome of each config (node 0 has the results)."""
    for line in unmeasured_lines(outcomes):
        console.print(line, highlight=False, soft_wrap=True)
    failed = [r for r in outcomes if r.status in FAILED_STATUSES]
    console.print(f"this node's outcomes: {run_dir / NODE_FILE}; the results and the report are on node 0"
                  + (f"  ([red]{len(failed)} failed[/red])" if failed else ""), highlight=False)
    return EXIT_FAILED if failed else EXIT_OK


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
