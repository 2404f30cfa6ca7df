"""Child processes of a sweep: the worker's command line, process-group kill, cgroup OOM-kill counter."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Protocol

from gpubench.backends.registry import rank_start
from gpubench.config import Config
from gpubench.errors import STORAGE_ERRNOS
from gpubench.launch import Interpreter
from gpubench.runner.nodes import Nodes


def worker_command(launcher: Interpreter, workdir: Path, config: Config, nodes: Nodes = Nodes()) -> list[str]:
    """The command line of the worker for one job. A distributed config's ranks (N on this node)
    are started as its backend declares (gpubench.options.RankStart): by the backend's node
    launcher (a local rendezvous on a free port, or the static rendezvous of a multi-node run),
    or each a process of its own started by gpubench.runner.ranks."""
    if not config.distributed:
        return launcher.command("gpubench.runner.worker", str(workdir))
    nproc = config.parallel.n
    start = rank_start(config)
    if start.node_module is None:
        return launcher.command("gpubench.runner.ranks", f"--nproc-per-node={nproc}", *nodes.launch_args(),
                                str(workdir))
    return launcher.command(start.node_module, *nodes.node_launcher_args(nproc), "-m", "gpubench.runner.worker",
                            str(workdir))


PROBE_BYTES = 1 << 20  # about what a worker's outcome with its raw step times and timeline takes


def storage_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot take a worker's outcome (no space, a quota, read-only), or None:
    asked when a worker ended without one, to tell the machine's failure from the config's."""
    probe = directory / f".space-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = bytes(PROBE_BYTES)
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno in (*STORAGE_ERRNOS, errno.EACCES):
            return f"{directory}: {e.strerror or e}"
        return None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


class Child(Protocol):
    """A worker as the runner waits for it and kills it: a ``subprocess.Popen``, or a worker
    forked by a server (gpubench.runner.forkserver.ForkedWorker); either leads a process group
    of its own."""

    pid: int
    returncode: int | Any

    def wait(self, timeout: float | None = None) -> int: ...


def kill_group(proc: Child, grace_s: float = 5.0) -> None:
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
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/sys/fs/cgroup/memory.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return None
