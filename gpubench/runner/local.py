"""The local launcher: each job a worker process on this machine, one at a time (a distributed
config's ranks started as its backend declares: gpubench.runner.job). On a node of a
multi-node run every node runs the same jobs in the same order and meets the others before
each distributed one. A ``batch_size = "max"`` config is searched first (reusing a search of an
earlier result). ``gpubench run --launcher local`` (the default) chooses it: ``Local``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from gpubench.config import MAX_BATCH
from gpubench.launch import Interpreter
from gpubench.results.result import Outcome, Result
from gpubench.runner.find_batch import batch_search, run_at_max_batch
from gpubench.runner.job import Job, run_worker
from gpubench.runner.launcher import Done, JobLauncher, LaunchContext, LauncherChoice
from gpubench.runner.nodes import Nodes, barrier


@dataclass
class LocalLauncher(JobLauncher):
    """``earlier``: results already in the run (when resuming), for a ``batch_size = "max"``
    search to reuse."""

    run_dir: Path = Path(".")
    interpreter: Interpreter = field(default_factory=Interpreter)
    nodes: Nodes = field(default_factory=Nodes)
    earlier: list[Result] = field(default_factory=list)
    heartbeat: Callable[[str], None] | None = None  # a line every 20 s on a worker still running
    _done: list[Done] = field(default_factory=list)

    def room(self) -> bool:
        return not self._done  # one at a time: each job's result is recorded before the next starts

    def submit(self, k: int, job: Job, started: Callable[[], None] = lambda: None) -> bool:
        started()
        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        t0 = time.perf_counter()
        config = job.config
        pre: tuple[str, str] | None = None
        if self.nodes.multi and config.batch_size == MAX_BATCH:
            pre = ("unsupported", 'batch_size = "max" is searched on one node; in a multi-node run give the batch '
                                  "(gpubench find-batch finds it)")
        elif self.nodes.multi and config.distributed:
            # every node at this config before any launcher starts its rendezvous
            pre = barrier(self.nodes, job.name, k, config.timeout_s)
        if pre:
            outcome = Outcome(status=pre[0], reason=pre[1])
        elif config.batch_size == MAX_BATCH:
            outcome = run_at_max_batch(job, batch_search(config, self.interpreter, self.earlier), self.run_dir,
                                       self.interpreter)
        else:
            outcome = run_worker(job, self.run_dir, self.interpreter, self.nodes, heartbeat=self.heartbeat)
        self._done.append(Done(k, job, outcome, started_at, time.perf_counter() - t0))
        return True

    def in_flight(self) -> int:
        return len(self._done)

    def ended(self) -> Iterator[Done]:
        done, self._done = self._done, []
        yield from done

    def seen(self, result: Result) -> None:
        self.earlier.append(result)


class Local(LauncherChoice):
    """``--launcher local``: this machine's worker processes (nothing kept in run.json: a
    resume runs here too)."""

    name = "local"

    def start(self, ctx: LaunchContext) -> JobLauncher:
        return LocalLauncher(probes=ctx.probes, run_dir=ctx.run_dir, interpreter=ctx.interpreter, nodes=ctx.nodes,
                             earlier=list(ctx.earlier), heartbeat=ctx.note)
