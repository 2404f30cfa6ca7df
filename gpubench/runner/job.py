"""One job of a sweep (a config repeat) and the fresh worker process that runs it.

A worker that raises, hangs, runs out of memory or is killed costs only its own job: its
outcome says so (``error`` with the child's traceback, ``timeout``, ``oom``).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubench.config import Config
from gpubench.hugepages import worker_env
from gpubench.launch import Launcher
from gpubench.results.result import Outcome
from gpubench.results.store import slug
from gpubench.runner.nodes import Nodes
from gpubench.runner.process import kill_group, oom_kill_count, worker_command

LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class Job:
    config: Config
    repeat: int
    options: dict[str, Any] | None = None  # passed to the worker in job.json (``profile``: gpubench profile)

    @property
    def name(self) -> str:
        return f"{slug(self.config.config_id)}-r{self.repeat}"


def _tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def run_worker(job: Job, run_dir: Path, launcher: Launcher = Launcher(), nodes: Nodes = Nodes(),
               train: Config | None = None) -> Outcome:
    """Run one job in a fresh process; its outcome, whatever happens to the worker. On
    node r > 0 of a multi-node run: this node's outcome (node 0 writes the result).
    ``train`` is the config the worker trains when it is not the job's own (a resolved
    ``batch_size = "max"``); files are still named after the job."""
    train = train or job.config
    workdir = run_dir / ".work" / job.name
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    (workdir / "job.json").write_text(json.dumps({"config": train.to_dict(), "repeat": job.repeat,
                                                  "options": job.options}))
    log_rel = Path("logs") / f"{job.name}.log"
    (run_dir / "logs").mkdir(exist_ok=True)
    oom_before = oom_kill_count()
    timeout_s = train.timeout_s
    env = launcher.env()
    env.update(worker_env(train.huge_pages, env))  # read as the worker starts
    with open(run_dir / log_rel, "wb") as log:
        proc = subprocess.Popen(worker_command(launcher, workdir, train, nodes),
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, pass_fds=launcher.pass_fds)
        if launcher.turns is not None:
            launcher.turns.close()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            shutil.rmtree(workdir, ignore_errors=True)
            return Outcome(status="timeout", reason=f"no result after {timeout_s:g} s (timeout_s); the worker was "
                                                    "killed", log=str(log_rel))
        except BaseException:
            kill_group(proc)
            raise
    result_path = workdir / "result.json"
    # a distributed config where a rank other than 0 failed: that rank's failure is the cause
    # (rank 0 then fails in a collective, or is stopped by torchrun)
    result_path = next(iter(sorted(workdir.glob("result-rank*.json"))), result_path)
    if result_path.exists():
        found = Outcome.from_outcome_json(json.loads(result_path.read_text()))
        found.log = str(log_rel)
        timeline = workdir / "timeline.json"
        if timeline.exists() and found.telemetry is not None:
            (run_dir / "telemetry").mkdir(exist_ok=True)
            rel = Path("telemetry") / f"{job.name}.json"
            shutil.move(str(timeline), run_dir / rel)
            found.telemetry["timeline"] = str(rel)
        shutil.rmtree(workdir, ignore_errors=True)
        return found
    shutil.rmtree(workdir, ignore_errors=True)
    rc = proc.returncode
    if rc == 0 and nodes.node_rank > 0:
        per_node = job.config.devices // nodes.nnodes
        first = nodes.node_rank * per_node
        ranks = f"rank {first}" if per_node == 1 else f"ranks {first}-{first + per_node - 1}"
        return Outcome(status="ok", reason=f"node {nodes.node_rank}: {ranks} finished; node 0 writes the result",
                       log=str(log_rel))
    tail = _tail(run_dir / log_rel, LOG_TAIL_LINES)
    if rc < 0:
        sig = signal.Signals(-rc).name
        oom_after = oom_kill_count()
        if sig == "SIGKILL" and oom_before is not None and oom_after is not None and oom_after > oom_before:
            return Outcome(status="oom", reason="worker killed by the kernel OOM killer (host memory exhausted)",
                           log=str(log_rel))
        reason = f"worker killed by {sig}"
    else:
        reason = f"worker exited with code {rc} without a result"
    last = next((line for line in reversed(tail) if line.strip()), "")
    if last:
        reason += f"; last output: {last.strip()[:300]}"
    return Outcome(status="error", reason=reason, traceback="\n".join(tail), log=str(log_rel))
