"""Run a sweep: each config repeat in a fresh worker process (gpubench.runner.job), results
appended as they finish; a job that fails costs only itself, and the sweep goes on."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpubench.backends import get_backend
from gpubench.backends.base import ProbeInfo
from gpubench.config import MAX_BATCH, Config
from gpubench.launch import Launcher
from gpubench.options import device_kind
from gpubench.results.result import Outcome, Result
from gpubench.results.store import NODE_FILE, RESULTS_FILE, append_result
from gpubench.runner.find_batch import batch_search, run_at_max_batch
from gpubench.runner.job import Job, run_worker
from gpubench.runner.mfu import mfu_metrics
from gpubench.runner.models import zoo_unavailable
from gpubench.runner.nodes import Nodes, barrier


def plan(configs: list[Config], repeats: int, done: Collection[tuple[str, int]] = frozenset()) -> list[Job]:
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
    missing = zoo_unavailable(config)
    if missing:
        return ("unavailable", missing)
    if probe is not None and not device_present(config.device, probe):
        return ("unavailable", f"no {config.device} device here; {config.framework} sees: "
                               f"{', '.join(probe.device_names()) or 'nothing'}")
    return None


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
