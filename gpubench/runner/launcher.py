"""The launcher interface: how the jobs of a sweep run. A launcher starts a job (a config
repeat), says which jobs have ended and with what outcome, and cancels what is in flight; the
one sweep loop (gpubench.runner.sweep.run_sweep) does everything else for every launcher: the
checks that need no worker, the result with its fingerprint, MFU, the results file, the
history and the progress line. ``gpubench run`` knows a launcher only as a ``LauncherChoice``
(its options as the user gave them: its checks of the sweep, what a resumed run keeps of it,
the ``JobLauncher`` it starts). Launchers: gpubench.runner.local (worker processes on this
machine, one job at a time, also as a node of a multi-node run) and gpubench.runner.slurm
(every job a Slurm batch job). Within a job, a distributed config's ranks start as its backend
declares (gpubench.options.RankStart), whichever launcher runs it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from gpubench.backends.base import ProbeInfo
from gpubench.config import Config
from gpubench.launch import Interpreter
from gpubench.results.result import Outcome, Result
from gpubench.runner.job import Job
from gpubench.runner.nodes import Nodes

# a job option (job.json) of a launcher whose jobs run on other machines: the worker puts the
# fingerprint of the node it ran on into its outcome's runtime under this key
NODE_ENV = "node_env"


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


@dataclass
class LaunchContext:
    """What a launcher is started with: the run directory, how children start, this machine's
    probes (empty for a remote launcher), the node layout of a multi-node run, the results
    already in the run (a resume), and where its progress lines go."""

    run_dir: Path
    interpreter: Interpreter
    probes: dict[str, ProbeInfo]
    nodes: Nodes
    earlier: list[Result]
    total: int  # jobs of the sweep, for progress lines
    note: Callable[[str], None] = lambda line: None


class LauncherChoice(ABC):
    """A launcher as chosen for a run (``gpubench run --launcher NAME`` and its options), before
    the run directory exists. ``name`` is its ``--launcher`` value and its key in run.json's
    ``args`` (where ``stored`` is kept, so that a resumed run continues under it). A
    ``remote`` launcher runs its jobs on other machines: their frameworks, models and device
    peaks are checked where each job runs (none here), and the run's fingerprint is that of the
    node its first job ran on (each result carries its own node's)."""

    name: ClassVar[str]
    remote: ClassVar[bool] = False

    def nnodes(self, nodes: Nodes) -> int:
        """The nodes each distributed config spans (part of its id)."""
        return nodes.nnodes

    def check(self, configs: list[Config], where: Path, nodes: Nodes) -> None:
        """Refuse (InputError, one line) what this launcher cannot run, before anything is
        written; ``where``: the run directory, or the directory runs go to."""
        return None

    def check_jobs(self, jobs: list[Job], launcher: Interpreter) -> None:
        """Check the jobs with whatever runs them (a scheduler's test submission), before
        anything is written."""
        return None

    def stored(self) -> dict[str, Any] | None:
        """What run.json keeps of this choice (None: nothing: a resume runs locally)."""
        return None

    @classmethod
    def from_stored(cls, stored: dict[str, Any]) -> LauncherChoice:
        """The choice ``stored`` kept."""
        return cls()

    def resumed(self, stored: LauncherChoice, where: Path) -> LauncherChoice:
        """This choice, given to resume a run started under ``stored`` (the same launcher)."""
        return self

    def cancelled_line(self, n: int) -> str:
        """What ``n`` jobs cancelled without a result were (Ctrl-C, an error)."""
        return f"{n} job(s) cancelled"

    @abstractmethod
    def start(self, ctx: LaunchContext) -> JobLauncher:
        """The launcher that runs the sweep's jobs."""
