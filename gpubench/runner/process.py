"""Child processes: environment, process-group kill, cgroup OOM-kill counter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import gpubench
from gpubench.config import Config
from gpubench.options import parse_parallelism
from gpubench.runner.nodes import Nodes

_PKG_ROOT = str(Path(gpubench.__file__).resolve().parent.parent)


def child_env() -> dict[str, str]:
    """The parent's environment, with this gpubench importable (also when run as
    ``PYTHONPATH=. python -m gpubench`` from a checkout)."""
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if _PKG_ROOT not in parts:
        env["PYTHONPATH"] = os.pathsep.join([_PKG_ROOT, *parts])
    return env


@dataclass(frozen=True)
class Launcher:
    """How to start a child: which Python, and where it finds gpubench. The default is this
    interpreter and this gpubench; ``gpubench ab`` launches two different ones."""

    python: str = sys.executable
    pythonpath: str | None = None  # a checkout whose gpubench the child imports instead of this one

    def env(self) -> dict[str, str]:
        if self.pythonpath is None:
            return child_env()
        env = dict(os.environ)
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != _PKG_ROOT]
        env["PYTHONPATH"] = os.pathsep.join([self.pythonpath, *parts])
        return env

    def command(self, module: str, *args: str) -> list[str]:
        return [self.python, "-m", module, *args]

    def worker_command(self, workdir: Path, config: Config, nodes: Nodes = Nodes()) -> list[str]:
        """The worker for one job. A distributed config's ranks (N on this node) are started by
        a launcher: PyTorch's elastic launcher (torchrun: a local rendezvous on a free port, or
        the static rendezvous of a multi-node run), or for TensorFlow's multiworker:N
        gpubench.runner.tf_launch (one TF_CONFIG per worker)."""
        if not config.distributed:
            return self.command("gpubench.runner.worker", str(workdir))
        kind, nproc = parse_parallelism(config.parallelism)
        if kind == "multiworker":
            return self.command("gpubench.runner.tf_launch", f"--nproc-per-node={nproc}", *nodes.launch_args(),
                                str(workdir))
        return self.command("torch.distributed.run", *nodes.torchrun_args(nproc), "-m", "gpubench.runner.worker",
                            str(workdir))


def kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the child's process group, then SIGKILL what is left after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            # the leader is gone; make sure nothing else of its group survives
            os.killpg(proc.pid, signal.SIGKILL)
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return
        return


def oom_kill_count() -> int | None:
    """The kernel's OOM-kill counter for this cgroup (cgroup v2), or None if not readable.

    A worker killed by SIGKILL while this counter went up was killed for memory."""
    try:
        for line in Path("/sys/fs/cgroup/memory.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None
