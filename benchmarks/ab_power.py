"""Does ``gpubench ab`` catch a real 5% slowdown on this machine, and stay quiet without one?

    PYTHONPATH=. python benchmarks/ab_power.py [--extra-passes 9] [--rounds 30] [--budget 9m] [--gates 1]
                                               [--aa] [--plain] [--pin] [--threads N] [--huge-pages]
                                               [--best-of K] [--window-s S] [--worker-cpu N] [--env KEY=VALUE]
                                               [--keep DIR] [--json FILE]
    PYTHONPATH=. python benchmarks/ab_power.py --calibrate [--extra-passes 9] [--threads N]

Builds two throw-away checkouts of this checkout's committed tree (HEAD). In the candidate,
the PyTorch trainer does real extra work after every optimizer step (``--extra-passes``
in-place passes over the parameters, values unchanged): training is really slower, a code
regression, not simulated numbers. With ``--aa`` both sides are the unchanged checkout (an
A/A gate: any ``regressed`` is a false alarm). Then it runs ``--gates`` times

    python -m gpubench ab suites/quick.toml --lockstep --baseline-path A --candidate-path B
        --set workload=mlp --set framework=torch --set device=cpu --set precision=fp32
        --set batch_size=256 --set warmup_steps=5 --set steps=100 --set windows=5 --set window_s=0
        --repeats ROUNDS [--budget TIME] --no-report

(``--plain``: without ``--lockstep``, the sides one after the other; ``--pin``: the whole A/B
under ``taskset -c 1`` with ``OMP_NUM_THREADS=1``; ``--threads N``: ``--set threads=N``, each
worker training with N threads; ``--huge-pages``: ``--set huge_pages=transparent``;
``--best-of K``: ``gpubench ab --best-of K``; ``--window-s S``: ``--set window_s=S``;
``--worker-cpu N``: every worker, of both sides, on CPU N alone
(``taskset -c N`` around each side's interpreter; gpubench itself stays unpinned), so that the
two workers of a lockstep round share one CPU's state) and prints each gate's
verdict, change with its interval, the spread of its rounds and its wall time, then the count
of each verdict. Exit 0 when every gate said what it should (``regressed`` with a slowdown,
anything but ``regressed`` in A/A), else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _slowdown import export_head, inject  # noqa: E402 - beside this file

SETS = ["workload=mlp", "framework=torch", "device=cpu", "precision=fp32", "batch_size=256", "warmup_steps=5",
        "steps=100", "windows=5", "window_s=0"]


def checkout(root: Path, name: str, passes: int) -> Path:
    """HEAD's tree in ``root/name``; with ``passes`` > 0, the trainer made slower."""
    path = export_head(root / name)
    if passes:
        inject(path, passes, "ab_power.py")
    return path


def pinned_python(out: Path, cpu: int) -> str:
    """An interpreter that runs on CPU ``cpu`` alone: a script that execs this one under taskset."""
    out.mkdir(parents=True, exist_ok=True)
    script = out / f"python-on-cpu{cpu}"
    script.write_text(f'#!/bin/sh\nexec taskset -c {cpu} "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    return str(script)


def gate(base: Path, cand: Path, rounds: int, lockstep: bool, out: Path, budget: str | None, pin: bool,
         sets: list[str], worker_cpu: int | None, extra_env: dict[str, str], best_of: int) -> dict:
    verdict_file = out / "verdicts.json"
    python = sys.executable if worker_cpu is None else pinned_python(out, worker_cpu)
    cmd = [*(["taskset", "-c", "1"] if pin else []), sys.executable, "-m", "gpubench", "ab", "suites/quick.toml",
           "--baseline-python", python,
           "--candidate-python", python, "--baseline-path", str(base), "--candidate-path", str(cand),
           "--repeats", str(rounds), "--no-report", "--out", str(out / "runs"), "--json", str(verdict_file),
           *(["--lockstep"] if lockstep else []), *(["--budget", budget] if budget else []),
           *(["--best-of", str(best_of)] if best_of > 1 else [])]
    overridden = {x.split("=", 1)[0] for x in sets}
    for s in [x for x in SETS if x.split("=", 1)[0] not in overridden] + sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(base), "COLUMNS": "200", **({"OMP_NUM_THREADS": "1"} if pin else {}),
           **extra_env}
    proc = subprocess.run(cmd, cwd=base, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1) or not verdict_file.exists():
        print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"gpubench ab exited with {proc.returncode}")
    found = json.loads(verdict_file.read_text())
    (v,) = found["verdicts"]
    return {"verdict": v["verdict"], "ratio": v["ratio"], "ci_low": v["ci_low"], "ci_high": v["ci_high"],
            "noise": v["noise"], "rounds": v["n_baseline"], "wall_s": round(wall, 1), "paired": found["paired"],
            "looks": found.get("looks", []), "alpha": found["alpha"]}


def calibrate(passes: int, threads: int, pairs: int = 24, steps: int = 100) -> None:
    """How much slower the injected passes make a step, in one process: blocks of ``steps``
    steps without and with them, alternating ``pairs`` times (the machine's drift falls on
    both); prints the median ratio of the step times with its spread."""
    import statistics

    import torch

    from gpubench.backends import get_backend
    from gpubench.config import Config
    from gpubench.runner.worker import build_trainer
    from gpubench.workloads import get_workload

    if threads:
        torch.set_num_threads(threads)
    config = Config(workload="mlp", framework="torch", device="cpu", batch_size=256, precision="fp32")
    trainer, _ = build_trainer(get_backend("torch"), get_workload("mlp").spec(), config, 0, 1, False)

    def block(extra: int) -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            trainer.step()
            with torch.no_grad():  # the same work as the injection
                params = [p for p in trainer.model.parameters()]
                for _ in range(extra):
                    torch._foreach_mul_(params, 1.0)
        return time.perf_counter() - t0

    for _ in range(20):
        trainer.step()
    ratios = [block(passes) / block(0) for _ in range(pairs)]
    q = statistics.quantiles(ratios, n=4)
    print(f"{passes} extra passes, {torch.get_num_threads()} thread(s): step time x{statistics.median(ratios):.3f} "
          f"(median of {pairs} pairs of "
          f"{steps}-step blocks; quartiles x{q[0]:.3f}, x{q[2]:.3f}), throughput "
          f"{100 * (1 / statistics.median(ratios) - 1):+.1f}%")


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * (x - 1):+.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--extra-passes", type=int, default=9,
                    help="the injected work per optimizer step (default 9: about 5%% slower on the 2-vCPU VM)")
    ap.add_argument("--rounds", type=int, default=30, help="rounds (repeats a side) of each gate (default 30)")
    ap.add_argument("--budget", help="gpubench ab --budget: rounds added while undecided, within this time "
                                     "(--rounds is then the first look's)")
    ap.add_argument("--pin", action="store_true", help="run the A/B on core 1 alone with one thread (taskset -c 1, "
                                                     "OMP_NUM_THREADS=1)")
    ap.add_argument("--threads", type=int, default=0,
                    help="--set threads=N: every worker trains with N threads (default 0: PyTorch's default)")
    ap.add_argument("--window-s", type=float, metavar="S",
                    help="--set window_s=S: time-bounded windows (each takes the steps that fit in S seconds)")
    ap.add_argument("--huge-pages", action="store_true",
                    help="--set huge_pages=transparent: the workers' memory in transparent huge pages")
    ap.add_argument("--best-of", type=int, default=1, metavar="K",
                    help="gpubench ab --best-of K: each side's best of K consecutive rounds makes a pair")
    ap.add_argument("--worker-cpu", type=int, metavar="N",
                    help="every worker of both sides on CPU N alone (taskset around the interpreter)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for gpubench ab and its workers (repeatable), e.g. "
                         "THP_MEM_ALLOC_ENABLE=1 (PyTorch's CPU allocator asks for transparent huge pages)")
    ap.add_argument("--gates", type=int, default=1, help="gates to run one after the other (default 1)")
    ap.add_argument("--aa", action="store_true", help="no slowdown: both sides the unchanged checkout")
    ap.add_argument("--plain", action="store_true", help="without --lockstep: the sides one after the other")
    ap.add_argument("--calibrate", action="store_true",
                    help="only measure, in this process, how much slower --extra-passes make a step")
    ap.add_argument("--keep", type=Path, help="build in this directory and keep it (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="write every gate's figures here")
    a = ap.parse_args(argv)
    if any("=" not in e for e in a.env):
        ap.error("--env: expected KEY=VALUE")
    extra_env = dict(e.split("=", 1) for e in a.env)
    if a.calibrate:
        calibrate(a.extra_passes, a.threads)
        return 0
    with tempfile.TemporaryDirectory(prefix="gpubench-ab-power-") as tmp:
        root = a.keep or Path(tmp)
        base = checkout(root, "baseline", 0)
        cand = base if a.aa else checkout(root, "candidate", a.extra_passes)
        what = "A/A (no slowdown)" if a.aa else f"candidate with {a.extra_passes} extra passes a step"
        print(f"{what}; {a.rounds} rounds a gate{f', more within --budget {a.budget}' if a.budget else ''}, "
              f"{'plain' if a.plain else 'lockstep'}{', on core 1 with one thread' if a.pin else ''}"
              f"{f', threads={a.threads}' if a.threads else ''}{', huge pages' if a.huge_pages else ''}"
              f"{f', best of {a.best_of}' if a.best_of > 1 else ''}"
              f"{f', windows of {a.window_s:g} s' if a.window_s is not None else ''}"
              f"{f', workers on CPU {a.worker_cpu}' if a.worker_cpu is not None else ''}"
              f"{''.join(f', {e}' for e in a.env)}", flush=True)
        gates = []
        for g in range(a.gates):
            sets = [*([f"threads={a.threads}"] if a.threads else []),
                    *(["huge_pages=transparent"] if a.huge_pages else []),
                    *([f"window_s={a.window_s:g}"] if a.window_s is not None else [])]
            found = gate(base, cand, a.rounds, not a.plain, root / f"gate{g}", a.budget, a.pin, sets,
                         a.worker_cpu, extra_env, a.best_of)
            gates.append(found)
            print(f"gate {g + 1}: {found['verdict']} {pct(found['ratio'])} [{pct(found['ci_low'])}, "
                  f"{pct(found['ci_high'])}], spread {pct(1 + found['noise'] if found['noise'] else None)}, "
                  f"{found['rounds']} rounds, alpha {found['alpha']:.3g}, {found['wall_s']:.0f} s", flush=True)
        counts: dict[str, int] = {}
        for found in gates:
            counts[found["verdict"]] = counts.get(found["verdict"], 0) + 1
        print("verdicts: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
        if a.json:
            a.json.write_text(json.dumps({"aa": a.aa, "extra_passes": 0 if a.aa else a.extra_passes,
                                          "lockstep": not a.plain, "pin": a.pin, "threads": a.threads,
                                          "huge_pages": a.huge_pages, "best_of": a.best_of, "window_s": a.window_s,
                                          "worker_cpu": a.worker_cpu, "env": extra_env,
                                          "gates": gates}, indent=1))
        wanted = [(g["verdict"] != "regressed") if a.aa else (g["verdict"] == "regressed") for g in gates]
        return 0 if all(wanted) else 1


if __name__ == "__main__":
    sys.exit(main())
