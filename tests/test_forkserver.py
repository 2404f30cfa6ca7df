"""Workers forked from a per-run server (gpubench.runner.forkserver): the same figures as a
spawned worker's, nothing of one config in the next, and the same statuses when a worker or
its server fails."""

from __future__ import annotations

import importlib
import json
import shutil
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from gpubench.backends.registry import BACKENDS
from gpubench.config import Config
from gpubench.launch import Interpreter
from gpubench.runner import forkserver
from gpubench.runner.job import Job, run_worker
from gpubench.workloads import WORKLOADS
from tests.conftest import REPO, plain_env, result_lines, run_cli

TORCH_MLP = """name = "{name}"
[defaults]
workload = "mlp"
depth = 2
width = 256
batch_size = 32
framework = "torch"
warmup_steps = 2
steps = 10
windows = 3
threads = 1
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_a_forked_worker_measures_what_a_spawned_one_does(tmp_path):
    """The same PyTorch config spawned (GPUBENCH_WORKER_START=spawn) and forked, two runs each,
    interleaved: its memory figures the same to a few per cent (the forked child maps the
    library pages its server's imports touched), its fastest step the same within noise (the
    fastest: the slow tier runs beside other tests on two cores), its threads the same, and
    the runtime says how each worker started."""
    suite = tmp_path / "s.toml"
    suite.write_text(TORCH_MLP.format(name="same"))
    found: dict[str, list[dict]] = {"spawn": [], "fork": []}
    for k in range(2):
        for mode in ("spawn", "fork"):
            out = tmp_path / f"{mode}{k}"
            proc = run_cli(["run", str(suite), "--out", str(out), "--repeats", "2", "--no-report", "--no-calibrate"],
                           cwd=tmp_path,
                           env=plain_env(GPUBENCH_WORKER_START=mode))
            assert proc.returncode == 0, proc.stdout + proc.stderr
            found[mode] += result_lines(next(out.iterdir()))
    spawn, fork = found["spawn"], found["fork"]
    assert {r["runtime"]["worker_start"] for r in spawn} == {"spawn"}
    assert {r["runtime"]["worker_start"] for r in fork} == {"fork (torch,torch._dynamo imported)"}
    assert {r["runtime"]["num_threads"] for r in spawn} == {r["runtime"]["num_threads"] for r in fork} == {1}
    for key in ("baseline_rss_bytes", "train_peak_rss_bytes", "peak_rss_bytes"):
        s = statistics.median(r["metrics"]["memory"][key] for r in spawn)
        f = statistics.median(r["metrics"]["memory"][key] for r in fork)
        assert abs(f - s) <= 0.05 * s, (key, s, f)
    s_step = min(t for r in spawn for t in r["metrics"]["step_times_ms"])
    f_step = min(t for r in fork for t in r["metrics"]["step_times_ms"])
    assert 0.5 < f_step / s_step < 2.0, (s_step, f_step)  # a broken BLAS or allocator would be many times off


LEAKY = '''import json, os, sys, threading, time
from pathlib import Path

import torch

CALLS = 0


def model():
    global CALLS
    if Path(sys.argv[0]).name == "worker.py":  # a config's worker (not the parent's check of the factory)
        seen = {"pid": os.getpid(), "calls": CALLS, "mark": getattr(torch, "_left_by_a_config", None),
                "env": os.environ.get("LEFT"),
                "threads": torch.get_num_threads(), "alive": threading.active_count(),
                "cmdline": open("/proc/self/cmdline", "rb").read().decode(errors="replace")}
        with open(os.environ["LEAK_LOG"], "a") as f:
            f.write(json.dumps(seen) + "\\n")
    CALLS += 1
    torch._left_by_a_config = True
    os.environ["LEFT"] = "1"
    torch.set_num_threads(1)
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
'''


def test_what_a_config_leaves_behind_does_not_reach_the_next(tmp_path):
    """Three forked configs of a factory that changes a module's global, torch's threads and
    a module attribute, the environment, and starts a thread: each config's worker sees none of
    it, and shows the command line a spawned worker has."""
    (tmp_path / "leaky.py").write_text(LEAKY)
    suite = tmp_path / "s.toml"
    suite.write_text('name = "leaky"\n[defaults]\nworkload = "leaky:model"\nframework = "torch"\ninput_shape = [16]\n'
                     "num_classes = 3\nbatch_size = 4\nwarmup_steps = 0\nsteps = 1\nwindows = 1\n"
                     "[matrix]\nseed = [0, 1, 2]\n")
    log = tmp_path / "leak.jsonl"
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--no-report", "--no-calibrate"],
                   cwd=tmp_path, env=plain_env(LEAK_LOG=str(log)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first: dict[int, dict] = {}  # a worker calls the factory more than once: its first call
    for line in log.read_text().splitlines():
        first.setdefault(json.loads(line)["pid"], json.loads(line))
    seen = list(first.values())
    assert len(seen) == 3
    threads = {s["threads"] for s in seen}
    assert len(threads) == 1 and threads != {1} or psutil.cpu_count() == 1
    for s in seen:
        assert (s["calls"], s["mark"], s["env"]) == (0, None, None), s
        assert s["alive"] == seen[0]["alive"], seen
        assert " -m gpubench.runner.worker " in s["cmdline"] and "/.work/" in s["cmdline"], s["cmdline"]
    results = result_lines(next((tmp_path / "runs").iterdir()))
    assert {r["runtime"]["worker_start"] for r in results} == {"fork (torch,torch._dynamo imported)"}


def _fault(mode: int, timeout_s: float = 60) -> Job:
    return Job(Config(workload="fault", framework="fake", device="cpu", batch_size=8, warmup_steps=0, steps=2,
                      windows=1, timeout_s=timeout_s, workload_params=(("mode", mode),)), 0)


@pytest.fixture
def fake_env(monkeypatch):
    """The fake backend in the workers' environment and, for this test only, in this process's
    registries (the runner asks them how its workers start); the other tests see the
    registries as gpubench ships them."""
    monkeypatch.setenv("GPUBENCH_PLUGINS", "tests.plugins.fake")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.delenv(forkserver.START_ENV, raising=False)
    backends, workloads = dict(BACKENDS), dict(WORKLOADS)
    if "tests.plugins.fake" in sys.modules:
        importlib.reload(sys.modules["tests.plugins.fake"])
    else:
        importlib.import_module("tests.plugins.fake")
    yield
    BACKENDS.clear()
    BACKENDS.update(backends)
    WORKLOADS.clear()
    WORKLOADS.update(workloads)


def _forked_child(run_dir: Path, job: Job, timeout_s: float = 60) -> psutil.Process:
    """The worker of ``job`` once it runs (its command line names its work directory)."""
    workdir = str(run_dir / ".work" / job.name)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for p in psutil.process_iter(["cmdline"]):
            if workdir in " ".join(p.info["cmdline"] or []) and "gpubench.runner.forkserver" not in (
                    p.info["cmdline"] or [""])[0]:
                return p
        time.sleep(0.05)
    raise AssertionError(f"{job.name}'s worker never started")


def test_a_server_that_dies_costs_its_running_config_only_and_leaves_no_orphan(tmp_path, fake_env):
    """The server is killed while its child hangs: that config is an error naming the cause,
    the child is gone with it, and the next config is forked by a new server."""
    hang = _fault(2)
    outcome: list = []
    t = threading.Thread(target=lambda: outcome.append(run_worker(hang, tmp_path, Interpreter())))
    t.start()
    child = _forked_child(tmp_path, hang)
    server = psutil.Process(child.ppid())
    assert "gpubench.runner.forkserver" in " ".join(server.cmdline())
    server.send_signal(signal.SIGKILL)
    t.join(30)
    assert not t.is_alive()
    (found,) = outcome
    assert found.status == "error" and "worker killed by SIGKILL (its fork server ended while it ran)" in found.reason
    deadline = time.time() + 10
    while not _gone(child.pid) and time.time() < deadline:
        time.sleep(0.05)
    assert _gone(child.pid)
    after = run_worker(_fault(0), tmp_path, Interpreter())
    assert after.status == "ok" and after.runtime["worker_start"] == "fork (gpubench imported)"


def test_a_forked_worker_that_crashes_or_hangs_is_reported_as_a_spawned_one(tmp_path, fake_env):
    """A forked worker killed by a signal, one that raises, and one that hangs past its
    timeout_s: the statuses and reasons of a spawned worker, its group killed."""
    killed = run_worker(_fault(4), tmp_path, Interpreter())
    assert killed.status == "error" and killed.reason.startswith("worker killed by SIGKILL"), killed.reason
    assert "fork server" not in killed.reason
    raised = run_worker(_fault(1), tmp_path, Interpreter())
    assert raised.status == "error" and "injected" in (raised.reason + (raised.traceback or "")), raised.reason
    hang = _fault(2, timeout_s=3)
    outcome: list = []
    t = threading.Thread(target=lambda: outcome.append(run_worker(hang, tmp_path, Interpreter())))
    t.start()
    child = _forked_child(tmp_path, hang)
    t.join(60)
    assert outcome[0].status == "timeout" and outcome[0].reason.startswith("no result after 3 s"), outcome[0].reason
    assert _gone(child.pid)


def test_a_gpubench_without_a_fork_server_is_spawned(tmp_path, fake_env):
    """The other side of ``gpubench ab`` may be a checkout whose gpubench has no fork server
    (here: one whose server module serves nothing): no server becomes ready, and its workers
    are spawned, as its own runner would start them."""
    older = tmp_path / "older"
    shutil.copytree(REPO / "gpubench", older / "gpubench", ignore=shutil.ignore_patterns("__pycache__"))
    server = older / "gpubench" / "runner" / "forkserver.py"
    server.write_text(server.read_text().partition('if __name__ == "__main__":')[0])  # serves nothing
    (older / "tests").symlink_to(REPO / "tests")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    found = run_worker(_fault(0), run_dir, Interpreter(pythonpath=str(older)))
    assert found.status == "ok", found.reason + (found.traceback or "")
    assert found.runtime["gpubench"]["path"] == str(older / "gpubench")
    assert found.runtime["worker_start"] == "spawn"


def test_a_server_outlives_the_thread_that_started_it(tmp_path, fake_env):
    """ab's lockstep rounds run each side in a pool thread that ends with the round: the server
    its first config started serves the next rounds (a parent-death signal would follow that
    thread, and kill the server, and a worker it was running, as the round ended)."""
    forkserver.close_all()
    first: list = []
    t = threading.Thread(target=lambda: first.append(run_worker(_fault(0), tmp_path, Interpreter())))
    t.start()
    t.join(60)
    assert first[0].status == "ok"
    (server,) = [s for s in forkserver._servers.values() if s is not None]
    time.sleep(0.5)  # what the thread's end would have set off
    assert server.proc.poll() is None
    again = run_worker(_fault(0), tmp_path, Interpreter())
    assert again.status == "ok" and [s for s in forkserver._servers.values() if s is not None] == [server]
    assert (tmp_path / again.log).read_text() == ""  # nothing of the server's in a worker's log


def test_waiting_for_a_forked_worker_is_waiting_for_a_process():
    """``ForkedWorker.wait`` as ``Popen.wait``: a timeout (0 too: a poll) while the worker runs,
    its exit status once the server reports it (a signal as a negative code), and a server
    gone before reporting it as the worker killed with it."""
    import socket
    import subprocess

    for said, code in ((b"exit 768", 3), (b"exit 9", -9), (b"", -9)):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        worker = forkserver.ForkedWorker(12345, mine)
        for timeout in (0, 0.05):
            with pytest.raises(subprocess.TimeoutExpired):
                worker.wait(timeout)
        if said:
            theirs.send(said)
        theirs.close()
        assert worker.wait(1) == code and worker.returncode == code and worker.server_died == (not said)
