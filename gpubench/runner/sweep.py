"""Run a sweep: the jobs (config repeats) of a run, checked, launched (gpubench.runner.launcher:
worker processes here, or Slurm batch jobs), and each made a result and appended as it
finishes; a job that fails costs only itself, and the sweep goes on."""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

from gpubench.backends import get_backend
from gpubench.backends.base import ProbeInfo
from gpubench.config import Config
from gpubench.options import device_kind
from gpubench.results.result import Outcome, Result
from gpubench.results.store import NODE_FILE, RESULTS_FILE, append_result
from gpubench.runner.cost import Prices, cost_metrics
from gpubench.runner.job import Job
from gpubench.runner.launcher import Done, JobLauncher
from gpubench.runner.mfu import mfu_metrics
from gpubench.runner.models import zoo_unavailable


def plan(configs: list[Config], repeats: int, done: Collection[tuple[str, int]] = frozenset()) -> list[Job]:
    """Repeats in rounds (all configs once, then again...), so that slow drift of the machine
    spreads over every config instead of landing on the last ones; finished jobs skipped."""
    return [Job(c, r) for r in range(repeats) for c in configs if (c.config_id, r) not in done]


def device_present(device: str, probe: ProbeInfo) -> bool:
    names = probe.device_names()
    return device in names or (":" not in device and any(device_kind(n) == device for n in names))


def pre_resolve(config: Config, probes: dict[str, ProbeInfo]) -> tuple[str, str] | None:
    """(status, reason) for a config that needs no worker: framework missing, device absent,
    combination unsupported. The worker checks again, so this is only a shortcut."""
    probe = probes.get(config.framework)
    if probe is not None and not probe.available:
        return ("unavailable", probe.reason)
    reason = config.topology_unsupported() or get_backend(config.framework).unsupported(config)
    if reason:
        return ("unsupported", reason)
    if missing := zoo_unavailable(config):
        return ("unavailable", missing)
    if probe is not None and not device_present(config.device, probe):
        return ("unavailable", f"no {config.device} device here; {config.framework} sees: "
                               f"{', '.join(probe.device_names()) or 'nothing'}")
    return None


Callback = Callable[[int, Job], None]
FinishCallback = Callable[[int, Job, Result], None]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_sweep(jobs: list[Job], launcher: JobLauncher, run_dir: Path, run_id: str, env: dict[str, Any],
              on_start: Callback | None = None, on_finish: FinishCallback | None = None,
              peaks: dict[str, dict[str, Any]] | None = None, node_rank: int = 0,
              prices: Prices | None = None) -> list[Result]:
    """The one sweep loop, for every launcher: each job checked first (a config that cannot run
    costs no worker: ``pre_resolve`` with what the launcher knows of its devices), submitted
    while the launcher has room, and, as it ends, made a result (with the fingerprint of where
    it ran), given its MFU against ``peaks`` and its cost at ``prices`` and appended to the
    run's results (node r > 0 of a multi-node run: its own outcome, to node.jsonl), then
    handed to ``on_finish`` (the history, the progress line). An error or Ctrl-C cancels what
    is in flight and propagates."""
    results: list[Result] = []
    queue = list(enumerate(jobs))
    refused = False

    def finish(done: Done) -> None:
        c = done.job.config
        result = Result.of(done.outcome, run_id=run_id, config_id=c.config_id, config_hash=c.config_hash,
                           repeat=done.job.repeat, config=c.to_dict(), env=done.env or env,
                           started_at=done.started_at, duration_s=done.duration_s)
        if node_rank > 0:
            result.node_rank = node_rank
            append_result(run_dir, result, NODE_FILE)
        else:
            flops = mfu_metrics(result, peaks or {})
            if flops is not None:
                result.with_metrics(**flops)
            cost = cost_metrics(result, prices) if prices is not None else None
            if cost is not None:
                result.with_metrics(cost=cost)
            append_result(run_dir, result, RESULTS_FILE)
        results.append(result)
        launcher.seen(result)
        if on_finish:
            on_finish(done.k, done.job, result)

    try:
        while queue or launcher.in_flight():
            while queue and launcher.room() and not refused:
                k, job = queue.pop(0)
                started: Callable[[], None] = partial(on_start, k, job) if on_start is not None else lambda: None
                pre = pre_resolve(job.config, launcher.probes)
                if pre is not None:
                    started()
                    finish(Done(k, job, Outcome(status=pre[0], reason=pre[1]), _now(), 0.0))
                elif not launcher.submit(k, job, started):
                    if not launcher.in_flight():  # nothing to wait for: it would never be tried again
                        raise RuntimeError(f"{type(launcher).__name__} refused {job.name} with no job in flight")
                    queue.insert(0, (k, job))  # submitted again once a job in flight has ended
                    refused = True
            launcher.queued = len(queue)
            before = launcher.in_flight()
            if before:
                for done in launcher.ended():
                    finish(done)
                # a job left the launcher (ended, or cancelled without a result): a refused
                # submission may be tried again
                refused = refused and launcher.in_flight() >= before
    except BaseException:
        launcher.cancel()
        raise
    return results
