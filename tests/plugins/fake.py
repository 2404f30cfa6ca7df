"""A test plugin: a numpy "framework" and a workload that misbehaves on request.

Loaded into worker processes through GPUBENCH_PLUGINS=tests.plugins.fake, it lets the runner
tests exercise real processes (raise, hang, run out of memory, be killed, diverge) in a
fraction of a second each, without importing a deep-learning framework.
"""

from __future__ import annotations

import os
import resource
import signal
import time

import numpy as np
import psutil

from gpubench.backends import register_backend
from gpubench.backends.base import Backend, Capabilities, DeviceInfo, ProbeInfo, Trainer
from gpubench.measure.timers import HostStepTimer
from gpubench.workloads import register_workload
from gpubench.workloads.base import Flatten, Linear, Param, Workload, WorkloadSpec

MODES = {0: "ok", 1: "raise", 2: "hang", 3: "oom", 4: "kill", 5: "nan", 6: "hog", 7: "nospace"}


def build_fault(mode: int) -> WorkloadSpec:
    return WorkloadSpec("fault", (1, 4, 4), 3, (Flatten(), Linear(3)))


register_workload(Workload("fault", "test workload: mode 0 ok, 1 raise, 2 hang, 3 oom, 4 kill, 5 nan, 6 hog, "
                                   "7 nospace",
                           build_fault, params=(Param("mode", 0, 0, "what goes wrong"),)))
register_backend("fake", "tests.plugins.fake:FakeBackend")


class FakeTrainer(Trainer):
    """Softmax regression with SGD in numpy: a real (tiny) training step whose loss falls."""

    def __init__(self, x: np.ndarray, y: np.ndarray, mode: str, lr: float, warmup_steps: int = 0) -> None:
        self.x = x.reshape(x.shape[0], x.shape[1], -1).astype(np.float64)
        self.y = y
        self.w = np.zeros((self.x.shape[2], int(y.max()) + 1))
        # FAKE_LR_SCALE: a candidate whose change breaks convergence (0: it never learns), for gate tests
        self.mode, self.lr, self.i, self.loss = mode, lr * float(os.environ.get("FAKE_LR_SCALE", "1")), 0, float("nan")
        self.losses: list[float] = []  # every step's, until read
        self.steps = 0
        self.warmup_steps = warmup_steps  # lr_warmup_steps: step k at lr (k + 1) / N, as every framework's
        # a fixed extra cost per step, for A/B tests of the gate (set by the test's environment)
        self.sleep_s = float(os.environ.get("FAKE_STEP_SLEEP_MS", "0")) / 1000

    def step(self) -> None:
        if self.mode == "hang":
            time.sleep(3600)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        x, y = self.x[self.i % len(self.x)], self.y[self.i % len(self.y)]
        self.i += 1
        logits = x @ self.w
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        self.loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
        p[np.arange(len(y)), y] -= 1
        rate = self.lr * min(1.0, (self.steps + 1) / self.warmup_steps) if self.warmup_steps else self.lr
        self.w -= rate * x.T @ p / len(y)
        self.steps += 1
        if self.mode == "nan" and self.steps > 3:
            self.loss = float("nan")
        self.losses.append(self.loss)

    def sync(self) -> None:
        pass

    def evaluate(self, batches) -> float:
        """The mean loss over held-out batches, no update."""
        losses = []
        for x, y in zip(batches.x.reshape(batches.x.shape[0], batches.x.shape[1], -1).astype(np.float64), batches.y):
            logits = x @ self.w
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            losses.append(float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean()))
        return float(np.mean(losses))

    def read_losses(self) -> list[float]:
        losses, self.losses = self.losses, []
        return losses

    def step_timer(self, n_steps: int) -> HostStepTimer:
        return HostStepTimer(n_steps)

    def memory(self) -> dict[str, int]:
        return {}


def fail_rank(config) -> None:
    """Rank GPUBENCH_TEST_FAIL_RANK of a distributed config fails as it is built (tests of a
    failing rank: the launcher must stop the others, the config ends error)."""
    rank = os.environ.get("RANK")
    if config.distributed and rank is not None and os.environ.get("GPUBENCH_TEST_FAIL_RANK") == rank:
        raise RuntimeError(f"injected failure on rank {rank} (GPUBENCH_TEST_FAIL_RANK)")


class FakeBackend(Backend):
    name = "fake"
    install_hint = "it is a test plugin"
    fork_preload = ()  # numpy only: its workers forked from a server that has imported gpubench's worker
    # numpy in float64: one precision, eager steps, device-resident batches; multiworker:N goes
    # through gpubench.runner.ranks (the per-rank launcher TensorFlow uses) with numpy ranks
    capabilities = Capabilities(precisions={"cpu": ("fp32",), "cuda": ("fp32",)},
                                parallelism=("single", "multiworker"),
                                notes={"precision=tf32": "the fake backend has no tf32"})

    def static_unsupported(self, config):
        return None

    def probe(self) -> ProbeInfo:
        return ProbeInfo("fake", True, version="0", devices=(DeviceInfo("cpu", "numpy"),))

    def check(self, config):
        reason = self.unsupported(config)
        if reason:
            return ("unsupported", reason)
        if config.device != "cpu":
            return ("unavailable", f"the fake backend has no {config.device}")
        return None

    def set_threads(self, n):
        self.threads = n  # numpy's small float64 operations here run on one thread whatever n is
        return None

    def build(self, spec, config, batches):
        fail_rank(config)
        mode = MODES[dict(config.workload_params).get("mode", 0)]
        if mode == "raise":
            raise ValueError("injected failure in build")
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        # a simulated device memory: batches above FAKE_MAX_BATCH do not fit (find-batch tests)
        if int(os.environ.get("FAKE_MAX_BATCH", "0")) and config.batch_size > int(os.environ["FAKE_MAX_BATCH"]):
            raise MemoryError(f"fake device: batch {config.batch_size} > FAKE_MAX_BATCH")
        if mode == "nospace":  # every file this worker writes stops at 256 bytes (EFBIG): no room for its outcome
            resource.setrlimit(resource.RLIMIT_FSIZE, (256, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        if mode == "hog":  # 2 GiB really written (past a Slurm job's --mem, the kernel kills the worker)
            hog = np.ones(1 << 28)
            del hog
        if mode == "oom":
            # address space capped just above what the process maps now, so the first 1 GiB
            # allocation fails at once (filling GiBs first made this mode slow on a loaded machine)
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            limit = psutil.Process().memory_info().vms + (256 << 20)
            resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
            hog = [np.ones(1 << 27) for _ in range(64)]  # 64 GiB, far past the limit
            del hog
        self.trainer = FakeTrainer(batches.x, batches.y, mode, config.lr, config.lr_warmup_steps)
        return self.trainer

    def is_oom(self, exc: BaseException) -> bool:
        return isinstance(exc, MemoryError)

    # a scripted device allocator in PyTorch's snapshot shape, where FAKE_ALLOCATOR=1: its live
    # blocks are the trainer's arrays, its history their allocations (and the failed request of
    # an oom); the torch backend reads torch.cuda.memory._snapshot() in this shape
    def memory_history_problem(self, config):
        return None if os.environ.get("FAKE_ALLOCATOR") else super().memory_history_problem(config)

    def start_memory_history(self, config, max_entries):
        self.history = []

    def stop_memory_history(self, config):
        self.history = None

    def allocator_snapshot(self, config):
        if not os.environ.get("FAKE_ALLOCATOR"):
            return None
        trainer = getattr(self, "trainer", None)
        arrays = [("x", trainer.x.nbytes), ("w", trainer.w.nbytes)] if trainer is not None else []
        frame = [{"filename": __file__, "line": 1, "name": "build"}]
        history = getattr(self, "history", None)
        blocks = [{"size": n, "requested_size": n, "address": i, "state": "active_allocated",
                   "frames": frame if history is not None else []} for i, (_, n) in enumerate(arrays)]
        trace = [] if history is None else [{"action": "alloc", "addr": b["address"], "size": b["size"],
                                             "frames": frame} for b in blocks]
        if history is not None and trainer is None:  # failed in build: the request that did not fit
            trace.append({"action": "oom", "size": 1 << 30, "device_free": 1 << 20, "frames": frame})
        return {"segments": [{"address": 0, "total_size": sum(b["size"] for b in blocks) + 4096,
                              "allocated_size": sum(b["size"] for b in blocks), "blocks": blocks}],
                "device_traces": [trace]}


register_backend("fake-advise", "tests.plugins.fake:FakeAdviseBackend")
# the step time of each practice of the advise backend, in ms (the baseline's: FAKE_STEP_SLEEP_MS or 2)
ADVISE_STEP_MS = {"compile=xla": 3.0, "optimizer_impl=fused": 1.4}


class FakeAdviseBackend(FakeBackend):
    """The fake with the practices ``gpubench advise`` measures, each with a known effect: a
    step sleeps a fixed time, so a practice's speed-up is set here. fused: faster; xla: slower;
    channels-last, foreach: the same; a batch twice as large: twice the samples a step; tf32
    learns worse (its steps climb the loss); amp-bf16 diverges; grad-accum:N sleeps N
    times a step; a batch above FAKE_MAX_BATCH does not fit unless activations are checkpointed
    (then it sleeps 1.5x, the recomputation)."""

    name = "fake-advise"
    capabilities = Capabilities(precisions={"cpu": ("fp32", "tf32", "amp-bf16"), "cuda": ("fp32",)},
                                parallelism=("single", "grad-accum"), compile=("none", "xla"),
                                memory_format=("contiguous", "channels-last"), checkpointing=("none", "activations"),
                                others={"optimizer_impl": ("auto", "for-loop", "foreach", "fused")})

    def build(self, spec, config, batches):
        limit = int(os.environ.get("FAKE_MAX_BATCH", "0"))
        if limit and config.checkpointing == "activations":
            os.environ["FAKE_MAX_BATCH"] = str(2 * limit)  # recomputed activations: twice the batch fits
        trainer = super().build(spec, config, batches)
        base = float(os.environ.get("FAKE_STEP_SLEEP_MS", "2"))
        ms = base
        for key, value in ADVISE_STEP_MS.items():
            setting, wanted = key.split("=")
            if str(getattr(config, setting)) == wanted:
                ms = value
        ms *= config.accum_steps * (1.5 if config.checkpointing == "activations" else 1.0)
        trainer.sleep_s = ms / 1000
        if config.precision == "tf32":  # learns worse: its steps climb the loss
            trainer.lr = -20 * config.lr
        if config.precision == "amp-bf16":
            trainer.mode = "nan"
        return trainer
