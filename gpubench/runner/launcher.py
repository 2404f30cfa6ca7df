"""The launcher interface: how the jobs of a sweep run. A launcher starts a job (a config
repeat), says which jobs have ended and with what outcome, and cancels what is in flight; the
one sweep loop (gpubench.runner.sweep.run_sweep) does everything else for every launcher: the
checks that need no worker, the result with its fingerprint, MFU, the results file, the
history and the progress line. Launchers: gpubench.runner.local (worker processes on this
machine, one job at a time: plain, under torchrun, TensorFlow's multi-worker launcher, and a
node of a multi-node run) and gpubench.runner.slurm (every job a Slurm batch job).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpubench.backends.base import ProbeInfo
from gpubench.results.result import Outcome, Result
from gpubench.runner.job import Job


@dataclass
class Done:
    """A job that has ended: its place in the sweep (``k``), its outcome, when it started and
    how long it ran, and where it ran when that is not this machine (the node's fingerprint)."""

    k: int
    job: Job
    outcome: Outcome
    started_at: str
    duration_s: float
    env: dict[str, Any] | None = None


@dataclass
class JobLauncher(ABC):
    """Runs a sweep's jobs. ``probes``: the frameworks and devices the jobs will see, where the
    launcher knows them (this machine's; empty where the jobs run elsewhere), for the checks
    that need no worker; ``cancelled``: jobs cancelled without an outcome (``--resume`` runs
    them again)."""

    probes: dict[str, ProbeInfo] = field(default_factory=dict)
    cancelled: int = 0
    queued: int = 0  # jobs of the sweep not submitted yet (set by the sweep loop, for progress lines)

    def room(self) -> bool:
        """Whether another job may be submitted now."""
        return True

    @abstractmethod
    def submit(self, k: int, job: Job, started: Callable[[], None] = lambda: None) -> bool:
        """Start the job (or queue it), calling ``started`` once it is (the progress line); False
        when it is refused for now, to be submitted again once a job in flight has ended."""

    @abstractmethod
    def in_flight(self) -> int:
        """Jobs submitted that have not been returned by ``ended`` yet."""

    @abstractmethod
    def ended(self) -> Iterator[Done]:
        """The jobs that have ended since the last call, one at a time (the loop records each
        before the next is read: an error while reading a later one costs none of the earlier),
        waiting a while (one poll) when none has."""

    def cancel(self) -> None:
        """Cancel every job in flight (Ctrl-C, an error): nothing is left running."""
        return None

    def seen(self, result: Result) -> None:
        """A result of the sweep, as it is recorded (a launcher that reuses earlier results)."""
        return None
