"""The one sweep loop (gpubench.runner.sweep.run_sweep) against scripted launchers: what it does
for every launcher, whatever the launcher's jobs do."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from gpubench.config import Config
from gpubench.errors import InputError
from gpubench.results.result import Outcome
from gpubench.results.store import load_results
from gpubench.runner.job import Job
from gpubench.runner.launcher import Done, JobLauncher, LaunchContext, LauncherChoice
from gpubench.runner.local import Local
from gpubench.runner.sweep import run_sweep

OK = Outcome(status="error", reason="scripted")  # any outcome: the loop records what it is given


def jobs(n: int) -> list[Job]:
    return [Job(Config(workload="mlp", seed=i), 0) for i in range(n)]


@dataclass
class Scripted(JobLauncher):
    """Takes at most ``limit`` jobs at once; refuses the submissions numbered in ``refuse``;
    each job in flight, when asked, ends as ``fate`` says: "ok", "cancel" (gone without an
    outcome) or "raise"."""

    limit: int = 1
    refuse: set[int] = field(default_factory=set)
    fate: Callable[[Job], str] = lambda job: "ok"
    live: list[tuple[int, Job]] = field(default_factory=list)
    submissions: int = 0
    polls: int = 0
    cancelled_live: int = 0

    def room(self) -> bool:
        return len(self.live) < self.limit

    def submit(self, k: int, job: Job, started: Callable[[], None] = lambda: None) -> bool:
        self.submissions += 1
        if self.submissions in self.refuse:
            return False
        self.live.append((k, job))
        started()
        return True

    def in_flight(self) -> int:
        return len(self.live)

    def ended(self) -> Iterator[Done]:
        self.polls += 1
        if self.polls > 50:
            raise AssertionError("the loop kept polling a launcher with nothing left to end")
        live, self.live = self.live, []
        for k, job in live:
            fate = self.fate(job)
            if fate == "cancel":
                self.cancelled += 1
            elif fate == "raise":
                raise OSError("the shared file system went away")
            else:
                yield Done(k, job, OK, "2026-11-26T00:00:00+00:00", 1.0)

    def cancel(self) -> None:
        self.cancelled_live = len(self.live)


def test_a_refused_job_is_submitted_again_after_the_jobs_in_flight_were_cancelled(tmp_path):
    # the third submission is refused while two jobs are in flight; then both are cancelled (no
    # outcome): the refused job must be tried again, not wait for an end that never comes
    launcher = Scripted(limit=3, refuse={3}, fate=lambda job: "cancel" if job.config.seed < 2 else "ok")
    started = []
    results = run_sweep(jobs(3), launcher, tmp_path, "run", {}, on_start=lambda k, job: started.append(k))
    assert [r.config["seed"] for r in results] == [2] and launcher.cancelled == 2
    assert started == [0, 1, 2] and launcher.submissions == 4
    assert [r.config["seed"] for r in load_results(tmp_path)] == [2]


def test_results_before_a_failing_job_are_recorded_and_the_rest_cancelled(tmp_path):
    launcher = Scripted(limit=3, fate=lambda job: "raise" if job.config.seed == 1 else "ok")
    with pytest.raises(OSError, match="shared file system"):
        run_sweep(jobs(3), launcher, tmp_path, "run", {})
    # the job that ended before the failing one keeps its result; the loop cancelled the rest
    assert [r.config["seed"] for r in load_results(tmp_path)] == [0]
    assert launcher.cancelled_live == 0  # ended() had taken every job out of flight


def test_a_launcher_that_refuses_with_nothing_in_flight_is_an_error_not_a_hang(tmp_path):
    with pytest.raises(RuntimeError, match="refused .* with no job in flight"):
        run_sweep(jobs(1), Scripted(refuse={1}), tmp_path, "run", {})


def test_a_config_that_cannot_run_costs_no_job(tmp_path):
    launcher = Scripted()
    bad = Job(Config(workload="mlp", framework="jax", compile="torch-compile"), 0)
    results = run_sweep([bad, *jobs(1)], launcher, tmp_path, "run", {"hostname": "here"})
    assert [r.status for r in results] == ["unsupported", "error"] and launcher.submissions == 1
    assert all(r.env == {"hostname": "here"} for r in results)


STARTED: list[tuple[str, int]] = []


@dataclass(frozen=True)
class Elsewhere(LauncherChoice):
    """A launcher whose jobs run on other machines, as gpubench run knows it: a choice with its
    options, which starts a Scripted launcher (the first job of a new run is cancelled)."""

    name: ClassVar[str] = "elsewhere"
    remote: ClassVar[bool] = True
    queue: str = "q"

    def stored(self) -> dict[str, Any] | None:
        return {"queue": self.queue}

    @classmethod
    def from_stored(cls, stored: dict[str, Any]) -> LauncherChoice:
        return cls(stored["queue"])

    def start(self, ctx: LaunchContext) -> JobLauncher:
        STARTED.append((self.queue, ctx.total))
        first = len(STARTED) == 1
        return Scripted(limit=2, fate=lambda job: "cancel" if first and job.config.seed == 0 else "ok")


def test_gpubench_run_knows_a_launcher_only_by_its_choice(tmp_path, write_suite, monkeypatch):
    """A launcher registered by name runs a sweep through the one loop; run.json keeps its
    options under its name, and --resume continues under it with the jobs left (no probe, model
    check or calibration here: its jobs run elsewhere)."""
    from rich.console import Console

    from gpubench.runner import run, session

    monkeypatch.setitem(session.LAUNCHERS, "elsewhere", Elsewhere)
    STARTED.clear()
    suite = write_suite('name = "s"\n[defaults]\nworkload = "mlp"\nsteps = 2\n[matrix]\nseed = [0, 1, 2]\n')
    console = Console(file=open(tmp_path / "out.txt", "w"), width=200)  # noqa: SIM115 - closed with the test
    code = run.execute(run.RunRequest(suite=str(suite), out=tmp_path / "runs", report=False, calibrate=False,
                                      launcher=Elsewhere("gpu")), console)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert code == run.EXIT_INTERRUPTED and STARTED == [("gpu", 3)]
    assert json.loads((run_dir / "run.json").read_text())["args"]["elsewhere"] == {"queue": "gpu"}
    assert sorted(r.config["seed"] for r in load_results(run_dir)) == [1, 2]
    code = run.execute(run.RunRequest(suite=None, out=tmp_path / "runs", resume=run_dir, report=False,
                                      calibrate=False), console)
    assert STARTED == [("gpu", 3), ("gpu", 1)]  # the stored choice, with the one job left
    assert code == run.EXIT_FAILED  # the scripted outcomes are errors
    assert sorted(r.config["seed"] for r in load_results(run_dir)) == [0, 1, 2]
    with pytest.raises(InputError, match="started with --launcher elsewhere, not local; resume it under elsewhere"):
        run.execute(run.RunRequest(suite=None, out=tmp_path / "runs", resume=run_dir, report=False, calibrate=False,
                                   launcher=Local()), console)
    console.file.close()
    assert "1 job(s) cancelled without a result" in (tmp_path / "out.txt").read_text()
