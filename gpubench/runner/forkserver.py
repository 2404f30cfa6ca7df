"""Workers forked from a server that has imported their framework once.

A config's worker is a process of its own, and a fresh interpreter pays the framework's import
(PyTorch and ``torch._dynamo``: most of a small config's cost) every time. Where a backend
declares its framework safe to fork after import (``Backend.fork_preload``: the import starts no
thread a fork would lose, creates no device context), the runner keeps one server process per
interpreter and environment: it imports those modules and gpubench's worker once, and forks one
child per config, which then runs exactly what ``python -m gpubench.runner.worker WORKDIR`` runs:
its own process (a session of its own, killed with its group), its own device context and
allocator (nothing of the kind exists in the server), its own environment, working directory and
log. Nothing a config does reaches the next one: each child is forked from the server, never from
an earlier child. A framework whose import starts threads (TensorFlow) is spawned as before, as
is every distributed config (its ranks start as its backend declares).

The server is started by the first config that can use it, kept while this process runs (ab's
and advise's rounds, a sweep), and ends with it: the kernel closes this process's end of the
server's control socket as it dies, however it dies, the server then ends, and the kernel kills
each of its children (``PR_SET_PDEATHSIG``) with it. A server that cannot start (an older
gpubench on the other side of ``gpubench ab``, a framework that fails to import) leaves its
configs to be spawned, where the failure, if it is the config's, is reported as before.
``GPUBENCH_WORKER_START=spawn`` spawns every worker.

``python -m gpubench.runner.forkserver FD MODULE...`` is the server; it talks to its parent over
the socket it is given as file descriptor FD (datagrams: ``ready``; a request with its file
descriptors; ``pid N`` and ``exit STATUS`` on the request's own socket).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpubench.launch import FORKED_ENV, PR_SET_PDEATHSIG, SIGKILL, Interpreter

START_ENV = "GPUBENCH_WORKER_START"  # "spawn": every worker a fresh interpreter
READY_TIMEOUT_S = 180.0  # a server that has not imported its modules by then is given up
PARENT_CHECK_S = 5.0  # how often an idle server looks whether its parent still lives
MAX_SERVERS = 3  # kept at once (each holds its framework's import in memory); the oldest is closed
_MESSAGE = 1 << 20
WORKER = "gpubench.runner.worker"  # the module each child runs as ``__main__``
# the server's last argument, blank: the room in which each child writes its command line
# (``retitle``), so that ``ps`` and ``psutil`` show it as a spawned worker's
TITLE_ROOM = 4096
_VOLATILE = ("GPUBENCH_TURNS",)  # per-worker variables: not part of which server can fork it


class ServerGone(Exception):
    """The fork server ended (or never became ready)."""


@dataclass(eq=False)
class ForkedWorker:
    """A worker forked by a server, seen from the runner as ``subprocess.Popen`` sees a child:
    ``pid`` (the leader of its own process group), ``wait``, ``returncode``. ``server_died``:
    the server ended before the worker's end was reported (its children die with it)."""

    pid: int
    _reply: socket.socket
    returncode: int | None = None
    server_died: bool = False

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        self._reply.settimeout(timeout)
        try:
            message = self._reply.recv(_MESSAGE)
        except (TimeoutError, BlockingIOError):  # BlockingIOError: a timeout of 0 (a poll)
            raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0.0) from None
        except OSError:
            message = b""
        if message.startswith(b"exit "):
            self.returncode = os.waitstatus_to_exitcode(int(message.split()[1]))
        else:  # the server is gone: the kernel killed its children with it (PR_SET_PDEATHSIG)
            self.server_died = True
            self.returncode = -signal.SIGKILL
        self._reply.close()
        return self.returncode


@dataclass(eq=False)
class _Server:
    """This process's handle on one server."""

    proc: subprocess.Popen[bytes]
    control: socket.socket
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fork(self, env: dict[str, str], log_fd: int, pass_fds: tuple[int, ...], workdir: str) -> ForkedWorker:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = json.dumps({"env": {k: v for k, v in env.items() if k in _VOLATILE}, "cwd": os.getcwd(),
                              "workdir": workdir, "fds": list(pass_fds)}).encode()
        try:
            with self.lock:
                socket.send_fds(self.control, [request], [theirs.fileno(), log_fd, *pass_fds])
            theirs.close()
            mine.settimeout(READY_TIMEOUT_S)
            said = mine.recv(_MESSAGE)
        except OSError as e:
            theirs.close()
            mine.close()
            raise ServerGone(str(e)) from None
        if not said.startswith(b"pid "):
            mine.close()
            raise ServerGone("the fork server ended before forking the worker")
        return ForkedWorker(int(said.split()[1]), mine)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.control.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_servers: OrderedDict[tuple[Any, ...], _Server | None] = OrderedDict()  # None: it could not start
_lock = threading.Lock()


def _key(launcher: Interpreter, env: dict[str, str], preload: tuple[str, ...]) -> tuple[Any, ...]:
    return (launcher.python, preload, tuple(sorted((k, v) for k, v in env.items() if k not in _VOLATILE)))


def _start(launcher: Interpreter, env: dict[str, str], preload: tuple[str, ...]) -> _Server | None:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        # not ``dying_with_parent``: the kernel's parent-death signal follows the *thread* that
        # started a process, and a server outlives the thread of its first config (ab's rounds run
        # in a pool); it ends when its control socket closes, which the kernel does as this
        # process dies, however it dies, and its children then die with it
        command = launcher.command("gpubench.runner.forkserver", str(theirs.fileno()), *preload, " " * TITLE_ROOM)
        server_env = {k: v for k, v in env.items() if k not in _VOLATILE}
        proc = subprocess.Popen(command, env=server_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, pass_fds=(theirs.fileno(),))
    except OSError:
        mine.close()
        return None
    finally:
        theirs.close()
    mine.settimeout(READY_TIMEOUT_S)
    try:
        ready = mine.recv(_MESSAGE)
    except OSError:
        ready = b""
    if ready != b"ready":
        mine.close()
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None
    mine.settimeout(None)
    return _Server(proc, mine)


def fork_worker(launcher: Interpreter, env: dict[str, str], log_fd: int, workdir: str,
                preload: tuple[str, ...] | None) -> ForkedWorker | None:
    """The worker for ``workdir`` forked by the server for this interpreter, environment and
    preload (started on first use, once more if it has died); None where it is to be spawned:
    its backend declares no preload, this is not Linux, ``GPUBENCH_WORKER_START=spawn``, or no
    server can be had."""
    if preload is None or not sys.platform.startswith("linux") or os.environ.get(START_ENV, "fork") == "spawn":
        return None
    key = _key(launcher, env, preload)
    for _ in range(2):
        with _lock:
            if key not in _servers:
                if len(_servers) >= MAX_SERVERS:
                    _, oldest = _servers.popitem(last=False)
                    if oldest is not None:
                        oldest.close()
                _servers[key] = _start(launcher, env, preload)
            _servers.move_to_end(key)
            server = _servers[key]
        if server is None:
            return None
        try:
            return server.fork(env, log_fd, launcher.pass_fds, workdir)
        except ServerGone:
            with _lock:
                if _servers.get(key) is server:
                    del _servers[key]
            server.close()
    return None


@atexit.register
def close_all() -> None:
    """End every server this process started (each kills what it still runs)."""
    with _lock:
        servers = [s for s in _servers.values() if s is not None]
        _servers.clear()
    for server in servers:
        server.close()


# ---- the server --------------------------------------------------------------------------------

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MADV_POPULATE_READ = 22  # Linux 5.14


def resident_file_pages() -> list[tuple[int, int]]:
    """The runs (address, bytes) of this process's file-backed pages that are in memory.

    A fork copies the page tables of a process's private memory, not of its read-only file
    mappings (the frameworks' libraries): a forked child's resident set would leave out the
    library pages its server's imports touched, which a spawned worker's includes (about 75 MB
    of PyTorch's), and its memory figures would not be a spawned worker's. The child maps
    these runs again (``populate``) before anything else."""
    runs: list[tuple[int, int]] = []
    with contextlib.suppress(OSError), open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
        for line in maps:
            fields = line.split()
            if len(fields) < 6 or not fields[5].startswith("/") or "r" not in fields[1]:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            pagemap.seek(start // _PAGE * 8)
            entries = pagemap.read((end - start) // _PAGE * 8)
            first = None
            for i, entry in enumerate(struct.unpack(f"{len(entries) // 8}Q", entries)):
                present = entry >> 63
                if present and first is None:
                    first = i
                elif not present and first is not None:
                    runs.append((start + first * _PAGE, (i - first) * _PAGE))
                    first = None
            if first is not None:
                runs.append((start + first * _PAGE, len(entries) // 8 * _PAGE - first * _PAGE))
    return runs


DEVICE_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")  # loaded once a process has touched a GPU or NVML


def device_libraries() -> list[str]:
    """The device libraries this process has loaded (none, in a server that may fork workers)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return [lib for lib in DEVICE_LIBRARIES if f"/{lib}" in maps]


def populate(runs: list[tuple[int, int]]) -> None:
    """Map ``runs`` into this process's page tables (read-only: nothing is copied)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for address, size in runs:
        if libc.madvise(address, size, _MADV_POPULATE_READ) != 0:  # an older kernel: touch each page
            for page in range(address, address + size, _PAGE):
                ctypes.string_at(page, 1)


def retitle(args: list[str]) -> None:
    """Show ``args`` as this process's command line (``/proc/self/cmdline``), as far as the room
    its own arguments took allows: the argument area is rewritten, one space between arguments
    and its last byte not NUL (how ``setproctitle`` tells the kernel to read it up to the NUL)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        text = " ".join(args).encode()[: end - start - 2] + b"\0"
        ctypes.memmove(start, text + b" " * (end - start - len(text)), end - start)


def _child(request: dict[str, Any], fds: list[int], server_fds: list[int], ppid: int,
           resident: list[tuple[int, int]]) -> None:
    """In the forked child: become what a spawned worker is, then run it; never returns."""
    code = 1
    try:
        populate(resident)
        os.setsid()  # a session and process group of its own, as ``start_new_session`` gives
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
        if os.getppid() != ppid:  # the server died while forking
            os._exit(125)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in server_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        reply, log, *passed = fds
        os.close(reply)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        # the passed descriptors (ab's turn pipes) where the worker's environment says they are
        moved = [os.dup(fd) for fd in passed]
        for fd in passed:
            os.close(fd)
        for fd, number in zip(moved, request["fds"]):
            os.dup2(fd, number)
            os.close(fd)
        # the server's environment as its interpreter's start and imports left it (a side's
        # sitecustomize may set variables, as it would in a spawned worker), with the worker's own
        # variables from the request; not what the server set for itself
        for key in (*_VOLATILE, *_server_set):
            os.environ.pop(key, None)
        os.environ.update(request["env"])
        os.environ[FORKED_ENV] = ",".join(_preloaded)
        os.chdir(request["cwd"])
        if not sys.flags.safe_path:  # ``python -m`` would have put the working directory first
            sys.path[0] = request["cwd"]
        sys.argv = [sys.argv[0], request["workdir"]]
        retitle([sys.executable, "-m", WORKER, request["workdir"]])
        sys.modules.pop(WORKER, None)  # as in a fresh interpreter: its imports loaded, not it
        runpy.run_module(WORKER, run_name="__main__", alter_sys=True)  # what ``python -m WORKER WORKDIR`` runs
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - whatever it is, the log says it and the worker fails
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(control: socket.socket, preload: list[str]) -> int:
    """Import ``preload`` and gpubench's worker, say ``ready``, then fork a worker per request
    until the control socket closes."""
    from gpubench.plugins import load_plugins

    load_plugins()
    # torch.cuda.is_available(), should an import ask, from NVML: the CUDA runtime's own check
    # initialises the driver, and a child forked after that cannot use the device
    if "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ:
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        _server_set.append("PYTORCH_NVML_BASED_CUDA_CHECK")
    importlib.import_module(WORKER)  # its imports, for every child
    for module in preload:
        with contextlib.suppress(ImportError):  # not installed: the worker says so, as a spawned one does
            importlib.import_module(module)
    if touched := device_libraries():  # a device touched after all: no child forked from here could use it
        control.send(b"refused: " + ", ".join(touched).encode())
        return 1
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    resident = resident_file_pages()
    control.send(b"ready")
    ppid = os.getpid()
    parent = os.getppid()
    while True:
        readable, _, _ = select.select([control.fileno(), wake_r], [], [], PARENT_CHECK_S)
        if os.getppid() != parent:  # the parent is gone, and something holds its end of the socket
            return 0
        if wake_r in readable:
            os.read(wake_r, 4096)
        _reap(children)
        if control.fileno() not in readable:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(control, _MESSAGE, 64)
        except OSError:
            message, fds = b"", []
        if not message:
            return 0  # the parent closed it: its children end with this process
        reply = socket.socket(fileno=fds[0])
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(json.loads(message), fds, [control.fileno(), wake_r, wake_w,
                                              *(s.fileno() for s in children.values())], ppid, resident)
        for fd in fds[1:]:
            os.close(fd)
        children[pid] = reply
        with contextlib.suppress(OSError):
            reply.send(b"pid %d" % pid)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        reply = children.pop(pid, None)
        if reply is not None:
            with contextlib.suppress(OSError):
                reply.send(b"exit %d" % status)
            reply.close()


_preloaded: list[str] = []  # in the server: the modules it imports
_server_set: list[str] = []  # in the server: the variables it set for itself, not for its children


def main(argv: list[str]) -> int:
    control = socket.socket(fileno=int(argv[0]))
    _preloaded[:] = [a for a in argv[1:] if a.strip()]
    try:
        return serve(control, _preloaded)
    except Exception:  # noqa: BLE001 - a module that fails to import: the parent spawns instead
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
