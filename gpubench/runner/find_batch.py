"""The largest batch that fits: doubling, then bisection, one fresh worker per probe.

A probe trains the config at one batch size for a few steps in its own process (so that a
failed allocation cannot leave the next probe a fragmented or poisoned device), through
the same worker as ``gpubench run``. ``ok`` means it fits, ``oom`` that it does not; any
other status stops the search with that reason.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpubench.config import MAX_BATCH, Config
from gpubench.launch import Interpreter
from gpubench.results.result import Outcome, Result
from gpubench.runner.job import Job, run_worker


def probe_config(config: Config, batch: int) -> Config:
    """The config a probe trains: ``batch``, a few steps, no telemetry."""
    return replace(config, batch_size=batch, warmup_steps=1, steps=2, windows=1, telemetry_interval_ms=0)


@dataclass
class Search:
    config_id: str
    max_batch: int | None = None  # the largest batch that trained; None if none did
    first_oom: int | None = None  # the smallest batch that ran out of memory (None: never)
    stopped: str = ""  # why the search ended early (a status other than ok/oom), else ""
    probes: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return vars(self)


Probe = Callable[[int], Outcome]


def search(probe: Probe, start: int, limit: int, unit: int = 1
           ) -> tuple[int | None, int | None, str, list[dict[str, Any]]]:
    """(largest ok batch, smallest oom batch, why it stopped early, probes) for a probe that
    returns a worker's outcome; batch sizes from ``start`` doubling up to ``limit``, then
    bisection between the last fit and the first miss. Every batch tried is a multiple of
    ``unit`` (``pipeline:N`` splits a batch into that many micro-batches); ``start`` is
    rounded up to one."""
    probes: list[dict[str, Any]] = []
    start = -(-start // unit) * unit

    def fits(b: int) -> bool | None:
        r = probe(b)
        probes.append({"batch_size": b, "status": r.status, "reason": r.reason,
                       "peak_allocated_bytes": r.get("metrics", "memory", "peak_allocated_bytes"),
                       "peak_rss_bytes": r.get("metrics", "memory", "peak_rss_bytes")})
        return True if r.status == "ok" else False if r.status == "oom" else None

    def stopped() -> str:
        return f"batch {probes[-1]['batch_size']}: {probes[-1]['status']}: {probes[-1]['reason']}"

    good, bad, b = None, None, start
    while b <= limit:  # doubling
        fit = fits(b)
        if fit is None:
            return good, bad, stopped(), probes
        if not fit:
            bad = b
            break
        good, b = b, b * 2
    # bisection between the last fit (0: none yet, e.g. the start itself failed) and the first miss
    while bad is not None and bad - (good or 0) > unit:
        mid = ((good or 0) + bad) // 2 // unit * unit
        fit = fits(mid)
        if fit is None:
            return good, bad, stopped(), probes
        good, bad = (mid, bad) if fit else (good, mid)
    return good, bad, "", probes


def find_max_batch(config: Config, limit: int, run_probe: Callable[[Config], Outcome]) -> Search:
    """The search for ``config``: each probe's config (``probe_config``) run by ``run_probe``, a
    worker in a temporary directory (a run's ``batch_size = "max"``) or a job of the session's
    run directory (``gpubench find-batch``, on any launcher)."""
    unit = config.pipeline_microbatches if config.pipelined else 1
    good, bad, stopped, probes = search(lambda b: run_probe(probe_config(config, b)), max(1, config.batch), limit,
                                        unit)
    return Search(config.config_id, good, bad, stopped, probes)


def batch_search(config: Config, launcher: Interpreter = Interpreter(),
                 earlier: Iterable[Result] = ()) -> dict[str, Any]:
    """For a ``batch_size = "max"`` config: the search's record (``metrics.batch_search``), from
    ``config.max_batch_start`` up to ``config.max_batch_limit``; reused from a result of the
    same config already in the run (a repeat, or a resumed run) so that every repeat trains at
    the same batch."""
    for r in earlier:  # the same settings (config_hash: the id leaves max_batch_start/limit out)
        found = r.get("metrics", "batch_search")
        if r.config_hash == config.config_hash and found:
            return dict(found)
    work = Path(tempfile.mkdtemp(prefix="gpubench-find-batch-"))
    try:
        s = find_max_batch(replace(config, batch_size=config.max_batch_start), config.max_batch_limit,
                           lambda c: run_worker(Job(c, 0), work, launcher))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"requested": MAX_BATCH, "start": config.max_batch_start, "limit": config.max_batch_limit,
            "max_batch": s.max_batch, "first_oom": s.first_oom, "stopped": s.stopped, "probes": s.probes}


def run_at_max_batch(job: Job, search: dict[str, Any], run_dir: Path,
                     launcher: Interpreter = Interpreter()) -> Outcome:
    """The outcome of a ``"max"`` job trained at the batch its search found (the search
    recorded in ``metrics.batch_search``); ``oom`` (or the status that stopped the search)
    when no batch fitted."""
    if search["max_batch"] is None:
        if search["stopped"]:
            return Outcome(status=search["probes"][-1]["status"],
                           reason=f'batch_size = "max": the search stopped at {search["stopped"]}',
                           metrics={"batch_search": search})
        return Outcome(status="oom", reason=f'batch_size = "max": not even batch {search["first_oom"]} fits',
                       metrics={"batch_search": search})
    found = run_worker(job, run_dir, launcher, train=replace(job.config, batch_size=search["max_batch"]))
    found.with_metrics(batch_search=search)
    return found
