"""One job of a sweep (a config repeat) and the fresh worker process that runs it.

A worker that raises, hangs, runs out of memory or is killed costs only its own job: its
outcome says so (``error`` with the child's traceback, ``timeout``, ``oom``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubench.backends.registry import declared
from gpubench.config import Config
from gpubench.errors import EXIT_STORAGE, STORAGE_LINE, StorageError
from gpubench.hugepages import worker_env
from gpubench.launch import Interpreter, dying_with_parent
from gpubench.results.result import Outcome
from gpubench.results.store import open_own, slug
from gpubench.runner import forkserver
from gpubench.runner.nodes import Nodes
from gpubench.runner.process import Child, kill_group, oom_kill_count, storage_problem, worker_command

LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class Job:
    config: Config
    repeat: int
    options: dict[str, Any] | None = None  # passed to the worker in job.json (``profile``: gpubench profile)

    @property
    def name(self) -> str:
        return f"{slug(self.config.config_id)}-r{self.repeat}"


def tail_lines(path: Path, n: int = LOG_TAIL_LINES) -> list[str]:
    """The last n lines of a log (none when it cannot be read)."""
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def prepare_workdir(job: Job, run_dir: Path, train: Config | None = None) -> tuple[Path, Path]:
    """A fresh work directory holding the worker's job.json, and the run-relative path of its
    log: (workdir, log_rel). A run directory that cannot take them is a StorageError."""
    train = train or job.config
    workdir = run_dir / ".work" / job.name
    shutil.rmtree(workdir, ignore_errors=True)
    try:
        workdir.mkdir(parents=True)
        (workdir / "job.json").write_text(json.dumps({"config": train.to_dict(), "repeat": job.repeat,
                                                      "options": job.options}))
        (run_dir / "logs").mkdir(exist_ok=True)
    except OSError as e:
        shutil.rmtree(workdir, ignore_errors=True)
        raise storage_error(job, run_dir, f"{e.filename or workdir}: {e.strerror or e}") from None
    return workdir, Path("logs") / f"{job.name}.log"


def storage_error(job: Job, run_dir: Path, problem: str) -> StorageError:
    return StorageError(f"{problem}: the run directory cannot take {job.name}'s outcome (nothing is recorded for it: "
                        f"not the config's failure); make room, then continue with: gpubench run --resume {run_dir}")


def storage_failure(job: Job, run_dir: Path, log_rel: Path, exit_code: int | None = None) -> StorageError | None:
    """For a job whose worker left no outcome: the StorageError to stop the sweep with when the
    cause is the run directory, not the config (None otherwise). The worker says so with
    EXIT_STORAGE and STORAGE_LINE in its log (a launcher in between, torchrun or Slurm, may hide
    the exit code, not the line); an older worker only fails, so the directory is also probed."""
    problem = storage_problem(run_dir)
    said = any(line.startswith(STORAGE_LINE) for line in tail_lines(run_dir / log_rel))
    if problem is None and exit_code != EXIT_STORAGE and not said:
        return None
    return storage_error(job, run_dir, problem or f"{run_dir / '.work' / job.name / 'result.json'}: the worker could "
                                                  f"not write it (see {run_dir / log_rel})")


def collect_outcome(job: Job, run_dir: Path, workdir: Path, log_rel: Path) -> Outcome | None:
    """The outcome the worker wrote in ``workdir`` (its telemetry timeline moved into the run
    directory), or None when it wrote none; the work directory is removed either way."""
    # a distributed config where a rank other than 0 failed: that rank's failure is the cause
    # (rank 0 then fails in a collective, or is stopped by torchrun)
    result_path = next(iter(sorted(workdir.glob("result-rank*.json"))), workdir / "result.json")
    if not result_path.exists():
        shutil.rmtree(workdir, ignore_errors=True)
        return None
    found = Outcome.from_outcome_json(json.loads(result_path.read_text()))
    found.log = str(log_rel)
    timeline = workdir / "timeline.json"
    if timeline.exists() and found.telemetry is not None:
        rel = Path("telemetry") / f"{job.name}.json"
        try:
            (run_dir / "telemetry").mkdir(exist_ok=True)
            shutil.move(str(timeline), run_dir / rel)
        except OSError as e:
            shutil.rmtree(workdir, ignore_errors=True)
            raise storage_error(job, run_dir, f"{run_dir / rel}: {e.strerror or e}") from None
        found.telemetry["timeline"] = str(rel)
    shutil.rmtree(workdir, ignore_errors=True)
    return found


def log_tail_reason(run_dir: Path, log_rel: Path, reason: str) -> tuple[str, str]:
    """``reason`` with the log's last non-empty line, and the log's tail (the traceback)."""
    tail = tail_lines(run_dir / log_rel)
    last = next((line for line in reversed(tail) if line.strip()), "")
    return (reason + (f"; last output: {last.strip()[:300]}" if last else "")), "\n".join(tail)


HEARTBEAT_S = 20.0  # a worker running longer says what it does this often (run_worker's ``heartbeat``)
PHASE_FILE = "phase"  # in the job's work directory: what the worker's rank 0 does now, and since when


def heartbeat_line(job: Job, workdir: Path, elapsed_s: float) -> str:
    """``mlp-torch-cpu-bs64-fp32-single: 40 s so far; window 2 of 3 (20 steps each), for 12 s``,
    from the worker's PHASE_FILE."""
    try:
        said = json.loads((workdir / PHASE_FILE).read_text())
        now = f"; {said['phase']}, for {max(0.0, time.time() - float(said['since'])):.0f} s"
    except (OSError, ValueError, KeyError, TypeError):  # not begun yet, or being rewritten
        now = "; starting"
    return f"  ... {job.name}: {elapsed_s:.0f} s so far{now}"


def _wait(proc: Child, timeout_s: float, job: Job, workdir: Path,
          heartbeat: Callable[[str], None] | None) -> None:
    """Wait for the worker, telling ``heartbeat`` what it does every HEARTBEAT_S; TimeoutExpired
    once ``timeout_s`` has passed."""
    t0 = time.monotonic()
    while True:
        left = timeout_s - (time.monotonic() - t0)
        try:
            proc.wait(timeout=max(0.0, min(left, HEARTBEAT_S)) if heartbeat is not None else timeout_s)
            return
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - t0
            if elapsed >= timeout_s or heartbeat is None:
                raise
            heartbeat(heartbeat_line(job, workdir, elapsed))


def run_worker(job: Job, run_dir: Path, launcher: Interpreter = Interpreter(), nodes: Nodes = Nodes(),
               train: Config | None = None, heartbeat: Callable[[str], None] | None = None) -> Outcome:
    """Run one job in a fresh process; its outcome, whatever happens to the worker. On
    node r > 0 of a multi-node run: this node's outcome (node 0 writes the result).
    ``train`` is the config the worker trains when it is not the job's own (a resolved
    ``batch_size = "max"``); files are still named after the job. ``heartbeat``: told every
    HEARTBEAT_S what a worker still running is doing (heartbeat_line)."""
    train = train or job.config
    workdir, log_rel = prepare_workdir(job, run_dir, train)
    oom_before = oom_kill_count()
    timeout_s = train.timeout_s
    env = launcher.env()
    env.update(worker_env(train.huge_pages, env))  # read as the worker starts
    log_fd = open_own(run_dir / log_rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, run_dir=run_dir)
    with os.fdopen(log_fd, "wb") as log:
        preload = None if train.distributed else declared(train.framework, "fork_preload", None)
        proc: Child | None = forkserver.fork_worker(launcher, env, log.fileno(), str(workdir), preload)
        if proc is None:
            proc = subprocess.Popen(dying_with_parent(worker_command(launcher, workdir, train, nodes)),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env, pass_fds=launcher.pass_fds)
        if launcher.turns is not None:
            launcher.turns.close()
        try:
            _wait(proc, timeout_s, job, workdir, heartbeat)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            shutil.rmtree(workdir, ignore_errors=True)
            return Outcome(status="timeout", reason=f"no result after {timeout_s:g} s (timeout_s); the worker was "
                                                    "killed", log=str(log_rel))
        except BaseException:
            kill_group(proc)
            raise
        # what the config left running in its session (a factory's background process) ends with it:
        # it would share the machine with the next config's measurement
        kill_group(proc, grace_s=1.0)
    found = collect_outcome(job, run_dir, workdir, log_rel)
    if found is not None:
        return found
    rc = proc.returncode
    failure = storage_failure(job, run_dir, log_rel, rc)
    if failure is not None:
        raise failure
    if rc == 0 and nodes.node_rank > 0:
        per_node = job.config.devices // nodes.nnodes
        first = nodes.node_rank * per_node
        ranks = f"rank {first}" if per_node == 1 else f"ranks {first}-{first + per_node - 1}"
        return Outcome(status="ok", reason=f"node {nodes.node_rank}: {ranks} finished; node 0 writes the result",
                       log=str(log_rel))
    if rc < 0:
        sig = signal.Signals(-rc).name
        oom_after = oom_kill_count()
        if sig == "SIGKILL" and oom_before is not None and oom_after is not None and oom_after > oom_before:
            return Outcome(status="oom", reason="worker killed by the kernel OOM killer (host memory exhausted)",
                           log=str(log_rel))
        reason = f"worker killed by {sig}"
        if getattr(proc, "server_died", False):
            reason += " (its fork server ended while it ran)"
    else:
        reason = f"worker exited with code {rc} without a result"
    reason, traceback = log_tail_reason(run_dir, log_rel, reason)
    return Outcome(status="error", reason=reason, traceback=traceback, log=str(log_rel))
