"""``gpubench run --launcher slurm``: every config repeat is a Slurm batch job.

Each job's batch script (``RUN_DIR/slurm/<job>.sbatch``, kept) asks for what the config needs
(its nodes: one, or ``--nnodes`` for a distributed config; the GPUs its parallelism uses on a
CUDA device; the config's ``timeout_s`` as the time limit unless ``--time`` says otherwise) and
runs the worker under ``srun``: directly, through the node launcher its backend declares (one
per node; across nodes, at its c10d rendezvous on the first node), or one task per rank for a
kind whose ranks are processes of their own (gpubench.options.RankStart). The worker writes its outcome
into its work directory in the run directory, which must be on a file system the nodes share.
gpubench submits with ``sbatch`` (at most ``--max-parallel`` jobs queued or running at once),
follows them with ``squeue`` and, for a job that has ended, ``scontrol`` or ``sacct``, and
appends each result as its job ends. A config that cannot run anywhere (unsupported) is
recorded without a job. A job that ends without an outcome gets Slurm's: ``TIMEOUT`` is
``timeout``, ``OUT_OF_MEMORY`` (or a step Slurm reports killed for memory) ``oom``,
``FAILED``, ``NODE_FAIL``, ``PREEMPTED`` and ``BOOT_FAIL`` ``error``, each with Slurm's
reason; a ``CANCELLED`` job (``scancel``, Ctrl-C) gets no result, so ``--resume`` submits it
again.

Why ``sbatch`` and not submitit: a gpubench worker is already a command that reads its job
from a directory and writes its outcome there, so a plain batch script per job is all Slurm
needs, one a user can read, run by hand and adapt; submitit pickles Python callables instead,
hides the script, and would add a dependency the GPU machines do not have.
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from gpubench.backends.registry import rank_start
from gpubench.config import MAX_BATCH, Config
from gpubench.errors import InputError
from gpubench.hugepages import worker_env
from gpubench.launch import RANKS_ENV, Interpreter
from gpubench.results.result import Outcome, Result
from gpubench.runner.job import Job, collect_outcome, log_tail_reason, prepare_workdir, storage_failure, tail_lines
from gpubench.runner.launcher import NODE_ENV, Done, JobLauncher, LaunchContext, LauncherChoice
from gpubench.runner.nodes import Nodes
from gpubench.runner.process import worker_command
from gpubench.runner.sweep import pre_resolve

# Slurm job states in which the job may still run (the rest are ends)
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                    "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "STOPPED"})
# a job that ended without the worker's outcome: the status Slurm's end state means
# (every other end: FAILED, NODE_FAIL, PREEMPTED, BOOT_FAIL, a COMPLETED job with no outcome, is error)
END_STATUS = {"TIMEOUT": "timeout", "DEADLINE": "timeout", "OUT_OF_MEMORY": "oom"}
CANCELLED = "CANCELLED"


@dataclass(frozen=True)
class SlurmOptions(LauncherChoice):
    """``--launcher slurm`` and its options: every job a Slurm batch job (SlurmLauncher), on
    the cluster's nodes (a remote launcher)."""

    name: ClassVar[str] = "slurm"
    remote: ClassVar[bool] = True

    partition: str | None = None
    account: str | None = None
    time: str | None = None  # sbatch --time; default: each config's timeout_s, in whole minutes
    gpus_per_node: int | None = None  # default: the GPUs the config's parallelism uses (CUDA configs)
    max_parallel: int = 0  # jobs queued or running at once; 0: all
    nodes: int = 1  # the nodes each distributed config spans (gpubench run --nnodes)
    sbatch_args: tuple[str, ...] = field(default_factory=tuple)  # passed through, e.g. "--qos=high"
    poll_s: float = 1.0

    def nnodes(self, nodes: Nodes) -> int:
        return self.nodes

    def check(self, configs: list[Config], where: Path, nodes: Nodes) -> None:
        check_path(where)
        if nodes.multi:
            raise InputError("--launcher slurm: --node-rank and --master-addr are for runs started by hand on every "
                             "node; under Slurm give the nodes each distributed config spans (SlurmOptions.nodes)")
        searched = [c.config_id for c in configs if c.batch_size == MAX_BATCH]
        if searched:
            raise InputError(f"--launcher slurm: batch_size \"max\" is searched on the machine that runs gpubench "
                             f"({searched[0]}); find it on a node with gpubench find-batch and give the number")
        numbered = [c.config_id for c in configs if c.device.startswith("cuda:")]
        if numbered:  # a job sees only the GPUs Slurm gave it, numbered from 0
            raise InputError(f"--launcher slurm: device: a numbered GPU ({numbered[0]}) is for a machine gpubench "
                             "runs on; under Slurm use device = \"cuda\": Slurm picks each job's GPUs")

    def check_jobs(self, jobs: list[Job], launcher: Interpreter) -> None:
        """``sbatch --test-only`` of every different request the sweep's scripts make, before
        anything is written: one Slurm refuses (unknown partition or account, too many GPUs) is
        one line, exit 2."""
        asked: set[tuple[str, ...]] = set()
        with tempfile.TemporaryDirectory(prefix="gpubench-slurm-") as tmp:
            path = Path(tmp) / "test.sbatch"
            for job in jobs:
                if pre_resolve(job.config, {}) is not None:  # recorded without a job
                    continue
                script = batch_script(job, Path(tmp) / "work", Path(tmp) / "log", launcher, self)
                request = tuple(line for line in script.splitlines() if line.startswith("#SBATCH")
                                and not line.startswith(("#SBATCH --job-name=", "#SBATCH --output=")))
                if request in asked:
                    continue
                asked.add(request)
                path.write_text(script)
                proc = _slurm("sbatch", "--test-only", str(path))
                if proc.returncode != 0:
                    lines = [x.removeprefix("sbatch: error: ").strip() for x in proc.stderr.splitlines() if x.strip()]
                    raise InputError("--launcher slurm: Slurm refused the job "
                                     f"({'; '.join(lines) or 'no reason given'})")

    def stored(self) -> dict[str, Any] | None:
        return {**asdict(self), "sbatch_args": list(self.sbatch_args)}

    @classmethod
    def from_stored(cls, stored: dict[str, Any]) -> LauncherChoice:
        return cls(**{**stored, "sbatch_args": tuple(stored.get("sbatch_args") or ())})

    def resumed(self, stored: LauncherChoice, where: Path) -> LauncherChoice:
        """New Slurm options for a Slurm run: the nodes each config spans stay (part of its id)."""
        spans = stored.nodes if isinstance(stored, SlurmOptions) else 1
        if self.nodes not in (1, spans):
            raise InputError(f"--resume {where}: --nnodes {self.nodes}: the run was started with --nnodes {spans}, "
                             "part of each config's id")
        return replace(self, nodes=spans)

    def cancelled_line(self, n: int) -> str:
        return f"{n} Slurm job(s) cancelled (scancel)"

    def start(self, ctx: LaunchContext) -> JobLauncher:
        return SlurmLauncher(
            run_dir=ctx.run_dir, options=self, interpreter=ctx.interpreter, on_note=ctx.note,
            on_counts=lambda p, r, f, why: ctx.note(f"slurm: {p} pending, {r} running, {f} finished of {ctx.total}"
                                                    + (f" (pending: {why})" if why else "")))


def _slurm(*cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a Slurm command; one that does not answer in time (slurmctld restarting, a busy
    cluster) is a failed call (exit code -1), for the caller to try again at its next poll."""
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise InputError(f"--launcher slurm: {cmd[0]} is not installed here (a Slurm submit host has sbatch, "
                         "squeue, scontrol and scancel)") from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(cmd), -1, "", f"{cmd[0]} did not answer within {timeout:g} s")


# one port per job for its rendezvous (a node launcher's c10d store, or the first of the
# workers' ports, one per task on a node), so that jobs sharing a node do not collide; below
# Linux's ephemeral range (32768-60999), where an outgoing connection could hold it
PORT_LINE = "port=$((20000 + SLURM_JOB_ID % 700 * 16))"
HOSTS_ENV = "GPUBENCH_SLURM_HOSTS"  # the job's host names, comma-separated, in Slurm's order


def batch_script(job: Job, workdir: Path, log: Path, launcher: Interpreter, options: SlurmOptions) -> str:
    """The job's sbatch script: its resources as #SBATCH lines, then the worker under srun.

    A distributed config whose backend declares a node launcher (gpubench.options.RankStart;
    PyTorch's ddp/pipeline: torchrun): one per node (``--ntasks-per-node=1``), which starts the
    node's ranks; on several nodes they meet at its c10d rendezvous on the first node. A kind
    whose every rank is a process of its own (TensorFlow's multiworker:N): N tasks per node,
    each a worker with its rank variables from Slurm's, and the backend's ``slurm_env``."""
    c = job.config
    # a distributed config's nnodes, else one (a single-process config in a multi-node run says
    # ``unsupported`` where it runs)
    nodes = c.nnodes if c.distributed else 1
    workdir, log = workdir.absolute(), log.absolute()  # whatever directory the job starts in
    check_path(log)  # given in double quotes: sbatch splits an #SBATCH line at blanks outside them
    per_node = c.parallel.n if c.distributed else 1
    start = rank_start(c) if c.distributed else None
    per_rank = start is not None and start.node_module is None
    gpus = options.gpus_per_node if options.gpus_per_node is not None else (
        c.devices // nodes if c.device.startswith("cuda") else 0)
    # every rank a CPU of its own: N tasks of one CPU (a task per rank), or one task of N CPUs
    # (a node launcher's N ranks); --sbatch-arg=--cpus-per-task=K, a later line, gives more (srun
    # takes the job's count from SLURM_CPUS_PER_TASK, as srun of Slurm 22.05 does not itself)
    tasks, cpus = (per_node, 1) if per_rank else (1, per_node)
    lines = ["#!/bin/bash", f"#SBATCH --job-name=gpubench-{job.name}",
             f"#SBATCH --output=\"{str(log).replace('%', '%%')}\"",  # sbatch reads %j, %u...
             f"#SBATCH --nodes={nodes}", f"#SBATCH --ntasks-per-node={tasks}", f"#SBATCH --cpus-per-task={cpus}",
             f"#SBATCH --time={options.time or max(1, math.ceil(c.timeout_s / 60))}"]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={gpus}")
    lines += [f"#SBATCH --{k}={v}" for k, v in (("partition", options.partition), ("account", options.account)) if v]
    lines += [f"#SBATCH {a}" for a in options.sbatch_args]
    env = launcher.env()
    exports: dict[str, str] = {k: env[k] for k in ("PYTHONPATH", "PYTHONSAFEPATH") if k in env}
    exports.update(worker_env(c.huge_pages, env))
    lines += ["", "# gpubench's worker: it reads job.json in its work directory and writes its outcome there"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in exports.items()]
    # a job Slurm requeued (its node failed) starts again without its first attempt's outcomes
    lines.append(f"rm -f {shlex.quote(str(workdir))}/result*.json {shlex.quote(str(workdir))}/timeline.json")
    # block: ranks numbered node by node, as node launchers and the rank variables expect; a
    # task that fails ends the others, as torchrun and gpubench's own launcher do
    srun = (f"srun --nodes={nodes} --ntasks-per-node={tasks} --cpus-per-task=$SLURM_CPUS_PER_TASK "
            "--distribution=block --kill-on-bad-exit=1 ")
    if per_rank:
        assert start is not None
        lines += [PORT_LINE, f"export {' '.join((*start.slurm_env, f'{RANKS_ENV}=slurm'))}",
                  f'export {HOSTS_ENV}=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd,)',
                  srun + shlex.join(launcher.command("gpubench.runner.worker", str(workdir)))]
    elif nodes > 1 and start is not None and start.node_module is not None:
        expanded = ("--rdzv-id=gpubench-$SLURM_JOB_ID", "--rdzv-endpoint=$head:$port")  # the shell fills these in
        command = launcher.command(start.node_module, f"--nnodes={nodes}", f"--nproc-per-node={per_node}",
                                   "--rdzv-backend=c10d", *expanded, "-m", "gpubench.runner.worker", str(workdir))
        lines += ['head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)', PORT_LINE,
                  srun + " ".join(a if a in expanded else shlex.quote(a) for a in command)]
    else:
        lines.append(srun + shlex.join(worker_command(launcher, workdir, c)))
    return "\n".join(lines) + "\n"


def check_path(path: Path) -> None:
    """A run directory whose path sbatch can be given (in double quotes, with no escapes)."""
    if '"' in str(path.absolute()) or "\\" in str(path.absolute()):
        raise InputError(f"--launcher slurm: {path}: a path with a double quote or a backslash cannot be given to "
                         "sbatch; choose another --out")


def slurm_ranks(environ: dict[str, str]) -> dict[str, str]:
    """The rank variables torchrun sets, from a Slurm task's own (a worker of a per-rank kind
    started by srun, the same number of tasks on every node): RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, GROUP_RANK. Nodes are numbered as TensorFlow's SlurmClusterResolver
    lists them, by host name sorted as text (``gpu10`` before ``gpu9``), which is not always
    Slurm's order: the job's host names, in Slurm's order, are in GPUBENCH_SLURM_HOSTS."""
    nodes = max(1, int(environ.get("SLURM_NNODES", "1")))
    per_node = int(environ.get("SLURM_NTASKS_PER_NODE") or int(environ["SLURM_NTASKS"]) // nodes)
    node = int(environ.get("SLURM_NODEID", "0"))
    hosts = [h for h in environ.get(HOSTS_ENV, "").split(",") if h]
    if len(hosts) == nodes:
        node = sorted(hosts).index(hosts[node])
    return {"RANK": str(node * per_node + int(environ["SLURM_LOCALID"])), "WORLD_SIZE": environ["SLURM_NTASKS"],
            "LOCAL_RANK": environ["SLURM_LOCALID"], "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(node)}


def _states(ids: list[str]) -> dict[str, tuple[str, str]] | None:
    """Job id -> (state, reason) for the jobs Slurm still knows (squeue, every state); None
    when squeue failed (nothing can be concluded from this poll)."""
    if not ids:
        return {}
    proc = _slurm("squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%r")
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:  # every id gone: squeue says so
        return None
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            out[parts[0]] = (parts[1], parts[2])
    return out


class Ended(NamedTuple):
    """An ended job as Slurm saw it: its end state and reason, its exit code, when it started
    (UTC, ISO 8601; "" if it never did) and how long it ran (whole seconds)."""

    state: str
    reason: str = ""
    exit_code: str = ""
    started_at: str = ""
    ran_s: float = 0.0


def _utc(stamp: str) -> str:
    """Slurm's local time stamp (``2026-11-26T04:10:00``; ``Unknown``, ``None`` if unset) in UTC."""
    try:
        return datetime.fromisoformat(stamp).astimezone(timezone.utc).isoformat(timespec="seconds")
    except ValueError:
        return ""


def _seconds(elapsed: str) -> float:
    """Slurm's ``[D-]HH:MM:SS`` (or plain seconds) in seconds; 0 when it cannot be read."""
    days, _, clock = elapsed.rpartition("-")
    try:
        return sum(float(x) * 60 ** i for i, x in enumerate(reversed(clock.split(":")))) + 86400 * int(days or 0)
    except ValueError:
        return 0.0


def _end(job_id: str) -> Ended | None:
    """How an ended job ended: scontrol while slurmctld keeps it, else sacct; None when
    scontrol failed for another reason than not knowing the job (ask again later)."""
    proc = _slurm("scontrol", "show", "job", "-o", job_id)
    if proc.returncode == 0 and "JobState=" in proc.stdout:
        f = dict(x.split("=", 1) for x in proc.stdout.split() if "=" in x)
        return Ended(f.get("JobState", "UNKNOWN"), f.get("Reason", ""), f.get("ExitCode", ""),
                     _utc(f.get("StartTime", "")), _seconds(f.get("RunTime", "")))
    if "Invalid job id" not in proc.stderr:
        return None
    try:
        proc = _slurm("sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,Reason,ExitCode,Start,ElapsedRaw")
    except InputError:  # no sacct on this host
        proc = subprocess.CompletedProcess([], 1, "", "")
    parts = (proc.stdout.strip().splitlines() or [""])[0].split("|")
    if proc.returncode == 0 and len(parts) == 5:  # "CANCELLED by 0" -> CANCELLED
        return Ended((parts[0].split() or ["UNKNOWN"])[0], parts[1], parts[2], _utc(parts[3]), _seconds(parts[4]))
    return Ended("UNKNOWN", "Slurm no longer knows the job (no scontrol record, no sacct)")


# what srun and slurmstepd write into the job's output when the kernel killed a step's process
# for the job's memory limit (the job itself then ends FAILED, its step OUT_OF_MEMORY)
OOM_LINE = re.compile(r"oom-kill event|task \d+: Out Of Memory")


def slurm_outcome(ended: Ended, job_id: str, run_dir: Path, log_rel: Path) -> Outcome:
    """The outcome of a job that ended without the worker's: Slurm's end state as a status
    (a step killed for the job's memory limit is ``oom``, whatever state the job ended in)."""
    status = END_STATUS.get(ended.state, "error")
    what = f"Slurm job {job_id} ended {ended.state}" + (
        f" ({ended.reason})" if ended.reason and ended.reason != "None" else "") + (
        f", exit code {ended.exit_code}" if ended.exit_code else "")
    oom = next((line.strip() for line in tail_lines(run_dir / log_rel) if OOM_LINE.search(line)), None)
    if status == "timeout":
        what += ": past its time limit"
    elif status == "oom" or oom is not None:
        status = "oom"
        what += ": out of memory (past the job's --mem)" + (f"; Slurm: {oom[:300]}" if oom else "")
    what, traceback = log_tail_reason(run_dir, log_rel, what)
    return Outcome(status=status, reason=what, traceback=traceback, log=str(log_rel))


@dataclass
class _Submitted:
    k: int
    job: Job
    workdir: Path
    log_rel: Path
    running: bool = False


def _now(seconds_ago: float = 0.0) -> str:
    return (datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)).isoformat(timespec="seconds")


@dataclass
class SlurmLauncher(JobLauncher):
    """Every job a Slurm batch job: submitted with ``sbatch`` (at most ``options.max_parallel``
    queued or running at once), followed with ``squeue``, and, once ended, its outcome read from
    its work directory (or Slurm's end state where the worker wrote none). ``on_counts`` hears
    the pending, running and finished counts with why the pending jobs wait (Slurm's reasons);
    ``on_note`` a line for the progress display. A submission Slurm refuses while jobs of the
    sweep are in flight (a limit on queued jobs) is submitted again once one of them ends;
    ``cancel`` (Ctrl-C, an error) cancels every job still queued or running."""

    run_dir: Path = Path(".")
    options: SlurmOptions = field(default_factory=lambda: SlurmOptions())
    interpreter: Interpreter = field(default_factory=Interpreter)
    on_counts: Callable[[int, int, int, str], None] | None = None
    on_note: Callable[[str], None] | None = None
    _live: dict[str, _Submitted] = field(default_factory=dict)
    _recorded: int = 0
    _counts: tuple[int, int, int, str] = (-1, -1, -1, "")

    def room(self) -> bool:
        return self.options.max_parallel <= 0 or len(self._live) < self.options.max_parallel

    def submit(self, k: int, job: Job, started: Callable[[], None] = lambda: None) -> bool:
        (self.run_dir / "slurm").mkdir(exist_ok=True)
        workdir, log_rel = prepare_workdir(replace(job, options={**(job.options or {}), NODE_ENV: True}),
                                           self.run_dir)
        script = self.run_dir / "slurm" / f"{job.name}.sbatch"
        script.write_text(batch_script(job, workdir, self.run_dir / log_rel, self.interpreter, self.options))
        proc = _slurm("sbatch", "--parsable", str(script))
        if proc.returncode != 0:
            message = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no reason given"
            if not self._live:
                raise InputError(f"--launcher slurm: sbatch refused {script}: {message}")
            if self.on_note:
                self.on_note(f"slurm: sbatch refused the next job ({message}); it is submitted again when one of "
                             f"the {len(self._live)} in flight ends")
            return False
        self._live[proc.stdout.strip().split(";")[0]] = _Submitted(k, job, workdir, log_rel)
        started()
        return True

    def in_flight(self) -> int:
        return len(self._live)

    def ended(self) -> Iterator[Done]:
        known = _states(list(self._live))
        if known is None:  # squeue failed: ask again at the next poll
            time.sleep(self.options.poll_s)
            return
        ended = 0
        waiting: set[str] = set()
        for job_id, sub in list(self._live.items()):
            state, why = known.get(job_id, ("", ""))
            if state in ACTIVE:
                sub.running = state in ("RUNNING", "COMPLETING")  # a requeued job is pending again
                if not sub.running and why and why != "None":
                    waiting.add(why)
                continue
            end = _end(job_id)
            if end is None or end.state in ACTIVE:
                continue
            del self._live[job_id]
            found = collect_outcome(sub.job, self.run_dir, sub.workdir, sub.log_rel)
            if found is None and end.state == CANCELLED:
                self.cancelled += 1  # no result: --resume submits it again
                continue
            if found is None and (failure := storage_failure(sub.job, self.run_dir, sub.log_rel)) is not None:
                raise failure  # the shared file system, not the config (the results before it are recorded)
            outcome = found or slurm_outcome(end, job_id, self.run_dir, sub.log_rel)
            outcome.runtime = {**(outcome.runtime or {}), "slurm": {"job_id": job_id, "state": end.state}}
            node_env = outcome.runtime.pop(NODE_ENV, None)  # the fingerprint of the node it ran on
            ended += 1
            yield Done(sub.k, sub.job, outcome, end.started_at or _now(end.ran_s), end.ran_s, node_env)
        running = sum(s.running for s in self._live.values())
        now = (len(self._live) - running + self.queued, running, self._recorded, ", ".join(sorted(waiting)))
        if self.on_counts and now != self._counts:
            self.on_counts(*now)
            self._counts = now
        if not ended and self._live:
            time.sleep(self.options.poll_s)

    def seen(self, result: Result) -> None:
        self._recorded += 1

    def cancel(self) -> None:
        if self._live:
            _slurm("scancel", *self._live)
