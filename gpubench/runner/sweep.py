"""Run a sweep: each config repeat in a fresh worker process, results appended as they finish.

A worker that raises, hangs, runs out of memory or is killed costs only its own config:
it is recorded as ``error`` (with the child's traceback), ``timeout`` or ``oom``, and the
sweep goes on.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpubench.backends import get_backend
from gpubench.backends.base import ProbeInfo
from gpubench.config import MAX_BATCH, Config
from gpubench.options import device_kind
from gpubench.results.result import Outcome, Result
from gpubench.results.store import NODE_FILE, RESULTS_FILE, append_result, slug
from gpubench.runner.mfu import mfu_metrics
from gpubench.runner.nodes import Nodes, barrier
from gpubench.runner.process import Launcher, kill_group, oom_kill_count

LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class Job:
    config: Config
    repeat: int
    options: dict[str, Any] | None = None  # passed to the worker in job.json (``profile``: gpubench profile)

    @property
    def name(self) -> str:
        return f"{slug(self.config.config_id)}-r{self.repeat}"


def plan(configs: list[Config], repeats: int, done: set[tuple[str, int]] = frozenset()) -> list[Job]:
    """Repeats in rounds (all configs once, then again...), so that slow drift of the machine
    spreads over every config instead of landing on the last ones; finished jobs skipped."""
    return [Job(c, r) for r in range(repeats) for c in configs if (c.config_id, r) not in done]


def device_present(device: str, probe: ProbeInfo) -> bool:
    names = probe.device_names()
    if device in names:
        return True
    return ":" not in device and any(device_kind(n) == device for n in names)


def pre_resolve(config: Config, probes: dict[str, ProbeInfo]) -> tuple[str, str] | None:
    """(status, reason) for a config that needs no worker: framework missing, device absent,
    combination unsupported. The worker checks again, so this is only a shortcut."""
    probe = probes.get(config.framework)
    if probe is not None and not probe.available:
        return ("unavailable", probe.reason)
    reason = config.topology_unsupported() or get_backend(config.framework).unsupported(config)
    if reason:
        return ("unsupported", reason)
    if probe is not None and not device_present(config.device, probe):
        return ("unavailable", f"no {config.device} device here; {config.framework} sees: "
                               f"{', '.join(probe.device_names()) or 'nothing'}")
    return None


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
    with open(run_dir / log_rel, "wb") as log:
        proc = subprocess.Popen(launcher.worker_command(workdir, train, nodes),
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=launcher.env())
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


Callback = Callable[[int, Job], None]
FinishCallback = Callable[[int, Job, Result], None]


def run_jobs(jobs: list[Job], run_dir: Path, run_id: str, env: dict[str, Any], probes: dict[str, ProbeInfo],
             on_start: Callback | None = None, on_finish: FinishCallback | None = None,
             earlier: list[Result] | None = None, launcher: Launcher = Launcher(),
             peaks: dict[str, dict[str, Any]] | None = None, nodes: Nodes = Nodes()) -> list[Result]:
    """Run the jobs in order, appending each result as it finishes. ``earlier`` are results
    already in the run (when resuming), to reuse a ``batch_size = "max"`` search; ``peaks`` are
    device calibrations, for MFU. Node r > 0 of a multi-node run appends its own outcome of
    each config to node.jsonl instead."""
    from gpubench.runner.find_batch import batch_search, run_at_max_batch  # find_batch imports this module

    results: list[Result] = []
    earlier = list(earlier or [])
    for k, job in enumerate(jobs):
        if on_start:
            on_start(k, job)
        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        t0 = time.perf_counter()
        pre = pre_resolve(job.config, probes)
        if pre is None and nodes.multi and job.config.batch_size == MAX_BATCH:
            pre = ("unsupported", 'batch_size = "max" is searched on one node; in a multi-node run give the batch '
                                  "(gpubench find-batch finds it)")
        if pre is None and nodes.multi and job.config.distributed:
            # every node at this config before any launcher starts its rendezvous
            pre = barrier(nodes, job.name, k, job.config.timeout_s)
        if pre:
            outcome = Outcome(status=pre[0], reason=pre[1])
        elif job.config.batch_size == MAX_BATCH:
            outcome = run_at_max_batch(job, batch_search(job.config, launcher, earlier + results), run_dir, launcher)
        else:
            outcome = run_worker(job, run_dir, launcher, nodes)
        result = Result.of(outcome, run_id=run_id, config_id=job.config.config_id,
                           config_hash=job.config.config_hash, repeat=job.repeat, config=job.config.to_dict(),
                           env=env, started_at=started_at, duration_s=time.perf_counter() - t0)
        if nodes.node_rank > 0:
            result.node_rank = nodes.node_rank
            append_result(run_dir, result, NODE_FILE)
        else:
            flops = mfu_metrics(result, peaks or {})
            if flops is not None:
                result.with_metrics(**flops)
            append_result(run_dir, result, RESULTS_FILE)
        results.append(result)
        if on_finish:
            on_finish(k, job, result)
    return results
