"""How a child process is started: which Python, and where it finds gpubench.

Below the runner and the calibration alike (both start children), so neither imports the other
for it.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import gpubench

_PKG_ROOT = str(Path(gpubench.__file__).resolve().parent.parent)
# set by gpubench.runner.ranks for a rank it starts: every rank's host:port, in rank order, as a
# JSON list (a backend whose ranks are processes of their own makes its cluster from it)
WORKERS_ENV = "GPUBENCH_WORKERS"
# "slurm" for a rank that srun started as a task of its own (gpubench run --launcher slurm): its
# rank variables are made from Slurm's (gpubench.runner.slurm.slurm_ranks)
RANKS_ENV = "GPUBENCH_RANKS"
# set in the environment of a worker forked by a server (gpubench.runner.forkserver): the modules
# the server had imported (the outcome's runtime says how the worker started)
FORKED_ENV = "GPUBENCH_FORKED_FROM"


@dataclass(frozen=True)
class Interpreter:
    """How to start a child: which Python, and where it finds gpubench. The default is this
    interpreter and this gpubench; ``gpubench ab`` launches two different ones."""

    python: str = sys.executable
    pythonpath: str | None = None  # a checkout whose gpubench the child imports instead of this one
    # lockstep (``gpubench ab --lockstep``): the child's ends of the two turn pipes and its role
    turns: TurnEnds | None = None
    # where the child imports the user's own code from (a suite's directory: its factories),
    # after gpubench's own path and before the inherited PYTHONPATH
    code_path: tuple[str, ...] = ()
    # the child imports nothing from its working directory (gpubench ab: each side the user's
    # code from its own checkout only, never the one the command was started in)
    isolated: bool = False

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if self.pythonpath is None:  # this gpubench importable (also when run as PYTHONPATH=. python -m gpubench)
            if _PKG_ROOT not in parts:
                env["PYTHONPATH"] = os.pathsep.join([_PKG_ROOT, *parts])
        else:
            env["PYTHONPATH"] = os.pathsep.join([self.pythonpath, *(p for p in parts if p != _PKG_ROOT)])
            # ``python -m`` puts the working directory first on sys.path, ahead of PYTHONPATH: run
            # from inside another checkout, the child would import that checkout's gpubench, not
            # this one's (Python 3.11+ honours this; older ones ignore it)
            env["PYTHONSAFEPATH"] = "1"
        if self.code_path:
            first, *rest = env["PYTHONPATH"].split(os.pathsep)
            env["PYTHONPATH"] = os.pathsep.join([first, *self.code_path, *(p for p in rest if p not in self.code_path)])
        if self.isolated:
            env["PYTHONSAFEPATH"] = "1"
        env.pop("GPUBENCH_TURNS", None)
        if self.turns is not None:
            env["GPUBENCH_TURNS"] = f"{self.turns.read},{self.turns.write},{self.turns.role}"
        return env

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self.turns.read, self.turns.write) if self.turns is not None else ()

    def command(self, module: str, *args: str) -> list[str]:
        return [self.python, "-m", module, *args]


@dataclass(eq=False)
class TurnEnds:
    """A lockstep worker's ends of the two turn pipes: it reads the token from ``read`` and
    writes it to ``write``. Once the worker has started (or will not start), ``close`` closes
    this process's copies, so that the worker is their only holder and its exit closes the
    pipes (the other side then stops waiting)."""

    read: int
    write: int
    role: str
    closed: bool = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.read)
            os.close(self.write)


def turn_pipes() -> tuple[TurnEnds, TurnEnds]:
    """The ends for two lockstep workers: (the first's, the second's)."""
    to_second, to_first = os.pipe(), os.pipe()  # (read end, write end) each
    return TurnEnds(to_first[0], to_second[1], "first"), TurnEnds(to_second[0], to_first[1], "second")


# prctl(PR_SET_PDEATHSIG, SIGKILL): the kernel kills this process when the thread that started it
# ends, whatever ends it (kill -9 included)
PR_SET_PDEATHSIG, SIGKILL = 1, 9
# the same, run by the child's own Python (an A/B's other checkout may have a gpubench without
# it), then exec'd into the command, which keeps the setting; a parent already gone ends it at once
_GUARD = ("import ctypes,os,sys\n"
          f"ctypes.CDLL(None).prctl({PR_SET_PDEATHSIG},{SIGKILL},0,0,0)\n"
          "os.getppid()==int(sys.argv[1]) or os._exit(125)\n"
          "os.execvp(sys.argv[2],sys.argv[2:])")


def dying_with_parent(command: list[str]) -> list[str]:
    """``command`` started so that it is killed when this process dies, also by SIGKILL: a
    worker left running would hold its device and falsify the next measurement, and a resume
    would run the same config beside it. Linux only (elsewhere the command as it is)."""
    if not sys.platform.startswith("linux"):
        return command
    return [command[0], "-S", "-c", _GUARD, str(os.getpid()), *command]


def die_with_parent() -> None:
    """The guard's setting for a process started by another launcher (a rank under torchrun or
    gpubench.runner.ranks): killed when that parent dies, and ended now if it already
    has (adopted by init). Best effort: nothing where prctl is missing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:
        os._exit(125)
