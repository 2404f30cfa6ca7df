"""Where the noise between processes comes from, and what removes it (PyTorch MLP, CPU).

    PYTHONPATH=. python benchmarks/noise_sources.py [--processes 8] [--steps 100] [--windows 5] [--warmup 20]
                                                    [--variants "default,1 thread"]
                                                    [--callgrind [--callgrind-timeout 600]]

Trains the MLP (depth 2, width 512, batch 256, fp32) in ``--processes`` fresh processes for
each variant, interleaved (one process of each variant in turn, so the machine's drift falls
on all alike), and prints for each variant the coefficient of variation between the processes
of four per-process figures:

- ``wall``: median wall time of a window of ``--steps`` steps (what the gate sees);
- ``cpu``: the same windows' process CPU time (user + system, all threads): a work measure
  that needs no wall clock;
- ``probe``: a fixed 256x256 matmul, timed between the windows in the same process;
- ``wall/probe``: the wall time normalised by the probe (a same-process reference for the
  machine's speed);
- ``min`` and ``p10``: the fastest window, and the 10th percentile of the single steps' wall
  times (estimators that ignore the windows and steps something else slowed down);

and the mean CV between a process's own windows. Variants: the default (PyTorch's own thread
count), one thread, one thread pinned to core 1 (``taskset``), two threads pinned to cores 0-1.

``--callgrind`` instead times what a deterministic work measure would cost: one process under
valgrind's callgrind with instrumentation off (``--instr-atstart=no``, the cheapest way to
reach the first step to count), importing PyTorch, building the trainer and training 3 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {"default": ({}, []), "1 thread": ({"THREADS": "1"}, []),
            "1 thread, core 1": ({"THREADS": "1"}, ["taskset", "-c", "1"]),
            "2 threads, cores 0-1": ({"THREADS": "2"}, ["taskset", "-c", "0,1"])}


def child(steps: int, windows: int, warmup: int) -> None:
    """One process: build the trainer, warm up, then per window its wall and CPU time and a probe."""
    import torch

    if os.environ.get("THREADS"):
        torch.set_num_threads(int(os.environ["THREADS"]))
    from gpubench.backends import get_backend
    from gpubench.config import Config
    from gpubench.runner.worker import build_trainer
    from gpubench.workloads import get_workload

    config = Config(workload="mlp", framework="torch", device="cpu", batch_size=256, precision="fp32")
    trainer, _ = build_trainer(get_backend("torch"), get_workload("mlp").spec(), config, 0, 1, False)
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def probe() -> float:
        t0 = time.perf_counter_ns()
        for _ in range(50):
            torch.mm(a, b)
        return (time.perf_counter_ns() - t0) / 1e6

    for _ in range(warmup):
        trainer.step()
    trainer.sync()
    out: dict[str, list[float]] = {"wall": [], "cpu": [], "probe": [], "steps": []}
    for _ in range(windows):
        out["probe"].append(probe())
        c0, t0 = time.process_time_ns(), time.perf_counter_ns()
        for _ in range(steps):
            s0 = time.perf_counter_ns()
            trainer.step()
            out["steps"].append((time.perf_counter_ns() - s0) / 1e6)
        trainer.sync()
        out["wall"].append((time.perf_counter_ns() - t0) / 1e6)
        out["cpu"].append((time.process_time_ns() - c0) / 1e6)
    print(json.dumps({**out, "threads": torch.get_num_threads()}))


def cv(values: list[float]) -> float:
    return 100 * statistics.stdev(values) / statistics.mean(values)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=20, help="steps before the first window (default 20)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated variants to run (default: all)")
    ap.add_argument("--callgrind", action="store_true", help="time one process under valgrind instead")
    ap.add_argument("--callgrind-timeout", type=float, default=600.0, help="seconds before it is stopped")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a.steps, a.windows, a.warmup)
        return 0
    if a.callgrind:
        if shutil.which("valgrind") is None:
            raise SystemExit("valgrind is missing")
        t0 = time.perf_counter()
        try:
            subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null",
                            sys.executable, __file__, "--child", "--steps", "3", "--windows", "1"],
                           env={**os.environ, "PYTHONPATH": str(REPO), "THREADS": "1"}, capture_output=True,
                           check=True, timeout=a.callgrind_timeout)
        except subprocess.TimeoutExpired:
            print(f"one process, import + build + 23 steps under valgrind (instrumentation off): not finished "
                  f"within {a.callgrind_timeout:g} s, stopped")
            return 1
        native = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--child", "--steps", "3", "--windows", "1"],
                       env={**os.environ, "PYTHONPATH": str(REPO), "THREADS": "1"}, capture_output=True, check=True)
        print(f"one process, import + build + 23 steps: {native - t0:.0f} s under valgrind (instrumentation off), "
              f"{time.perf_counter() - native:.1f} s natively")
        return 0
    if shutil.which("taskset") is None:
        raise SystemExit("taskset is missing (util-linux)")
    chosen = [v.strip() for v in a.variants.split(",")]
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(unknown)} (allowed: {', '.join(VARIANTS)})")
    rows: dict[str, list[dict]] = {name: [] for name in chosen}
    for _ in range(a.processes):
        for name in chosen:
            env, prefix = VARIANTS[name]
            proc = subprocess.run([*prefix, sys.executable, __file__, "--child", "--steps", str(a.steps), "--windows",
                                   str(a.windows), "--warmup", str(a.warmup)],
                                  env={**os.environ, "PYTHONPATH": str(REPO), **env}, capture_output=True, text=True,
                                  check=True)
            rows[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"{a.processes} processes a variant, {a.warmup} warm-up steps, {a.windows} windows of {a.steps} steps; "
          "CV between processes of each process's median")
    print(f"{'variant':<22} {'threads':>7} {'wall ms':>8} {'wall':>6} {'min':>6} {'p10':>6} {'cpu':>6} {'probe':>6} "
          f"{'wall/probe':>10} {'within':>7}")
    for name, found in rows.items():
        med = {k: [statistics.median(r[k]) for r in found] for k in ("wall", "cpu", "probe")}
        norm = [w / p for w, p in zip(med["wall"], med["probe"])]
        within = statistics.mean(cv(r["wall"]) for r in found)
        fastest = [min(r["wall"]) for r in found]
        p10 = [statistics.quantiles(r["steps"], n=10)[0] for r in found]
        print(f"{name:<22} {found[0]['threads']:>7} {statistics.mean(med['wall']):>8.0f} {cv(med['wall']):>5.1f}% "
              f"{cv(fastest):>5.1f}% {cv(p10):>5.1f}% {cv(med['cpu']):>5.1f}% {cv(med['probe']):>5.1f}% "
              f"{cv(norm):>9.1f}% {within:>6.1f}%")
    print("window time / the process's median, mean over the processes, by window (a trend = not yet steady):")
    for name, found in rows.items():
        by_window = [statistics.mean(r["wall"][i] / statistics.median(r["wall"]) for r in found)
                     for i in range(a.windows)]
        print(f"{name:<22} " + " ".join(f"{x:.3f}" for x in by_window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
