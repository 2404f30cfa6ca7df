"""A config's fixed cost: what a tiny config pays beyond its training, by part, beside a bare
interpreter's start and a bare framework import, all measured in one run.

What it measures, per framework (and the fake test backend, which imports no framework):

- ``bare_python_s``: ``python -c pass``, start to exit;
- ``bare_import_s``: ``python -c "import <framework>; <one tiny op>"``, start to exit (the issue's
  reference: a config should cost no more than this);
- the parts of one config, in a fresh child (``_fixed_cost_child.py``) that calls the worker's
  own functions in the worker's order, each timed: ``gpubench_imports`` (the worker's module and
  what it imports), ``framework`` (``admit``: the backend's check, which imports the framework),
  ``model`` (``backend.native``: the model built, its FLOPs counted), ``trainer`` (data pool,
  optimizer, compilation), ``telemetry_start``, ``training`` (the cold step, warm-up and windows:
  what the config is for), ``telemetry_stop``, ``result_write``; ``spawn_to_main_s`` is the
  child's start (interpreter and ``site``) up to its first line, and ``exit_s`` its end after the
  last part;
- ``import_threads``: the threads of a process that has imported the framework (and nothing
  else): what a fork after the import would not carry beyond the BLAS pool numpy starts (a
  backend declares its framework forkable only where this is numpy's alone);
- ``probe_s``: one framework probe (``gpubench.runner.probe.probe``), paid once a run;
- ``sweep_per_config_s``: a ``gpubench run`` of ``--configs`` one-step configs of the MLP (they
  differ in their seed), its wall time over the configs (probes, checks and report included), and
  ``sweep_ratio``: that over ``bare_import_s`` (the aim: below 1.0); the workers start as the run
  starts them (forked from a per-run server where the backend allows it:
  gpubench.runner.forkserver); ``sweep_spawn_per_config_s`` and ``spawn_ratio``: the same sweep
  with every worker spawned (``GPUBENCH_WORKER_START=spawn``).

Every figure is the median of ``--repeats`` runs, interleaved part by part, with its minimum and
maximum. No figure is asserted: they go to docs/performance.md with the command.

    PYTHONPATH=. python benchmarks/fixed_cost.py [--frameworks torch,jax,tensorflow,fake] [--repeats 3]
        [--configs 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# a framework's smallest real work after its import, for the bare reference
BARE_OP = {"torch": "import torch; torch.ones(1)", "tensorflow": "import tensorflow as tf; tf.ones(1)",
           "jax": "import jax.numpy as jnp; jnp.ones(1).block_until_ready()", "fake": "import numpy; numpy.ones(1)"}
SUITE = """name = "fixed-cost"
[defaults]
workload = "mlp"
depth = 1
width = 32
batch_size = 8
warmup_steps = 0
steps = 1
windows = 1
threads = 1
framework = "{framework}"
[matrix]
seed = [{seeds}]
"""


def _env(framework: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    if framework == "fake":
        env["GPUBENCH_PLUGINS"] = "tests.plugins.fake"
    return env


def _timed(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... exited {proc.returncode}: {proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def parts(framework: str) -> dict[str, float]:
    """One config's parts, timed in a fresh child; the child's start and end from here."""
    env = _env(framework)
    start = time.time()
    elapsed, out = _timed([sys.executable, str(HERE / "_fixed_cost_child.py"), framework], env)
    end = time.time()
    found = json.loads(out.strip().splitlines()[-1])
    marks = found.pop("marks")
    figures = {"spawn_to_main_s": marks[0] - start, "exit_s": end - marks[-1], "child_wall_s": elapsed}
    figures.update(found)
    return figures


IMPORT = {"torch": "import torch", "tensorflow": "import tensorflow", "jax": "import jax, jax.numpy",
          "fake": "import numpy"}


def import_threads(framework: str) -> float:
    code = f"{IMPORT[framework]}; import os; print(len(os.listdir('/proc/self/task')))"
    return float(_timed([sys.executable, "-c", code], _env(framework))[1].strip().splitlines()[-1])


def probe_s(framework: str) -> float:
    code = f"from gpubench.runner.probe import probe; import sys; p = probe({framework!r}); sys.exit(not p.available)"
    if framework == "fake":
        code = "from gpubench.plugins import load_plugins; load_plugins(); " + code
    return _timed([sys.executable, "-c", code], _env(framework))[0]


def sweep(framework: str, configs: int, start: str = "") -> float:
    with tempfile.TemporaryDirectory(prefix="gpubench-fixed-") as tmp:
        suite = Path(tmp) / "s.toml"
        text = SUITE.format(framework=framework, seeds=", ".join(map(str, range(configs))))
        if framework == "fake":  # the fake backend's own workload, which takes no mlp parameters
            text = text.replace('workload = "mlp"\ndepth = 1\nwidth = 32\n', 'workload = "fault"\n')
        suite.write_text(text)
        elapsed, _ = _timed([sys.executable, "-m", "gpubench", "run", str(suite), "--out", str(Path(tmp) / "runs"),
                             "--no-report", "--no-calibrate"],
                            {**_env(framework), **({"GPUBENCH_WORKER_START": start} if start else {})}, cwd=Path(tmp))
    return elapsed / configs


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frameworks", default="torch,jax,tensorflow,fake")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", type=int, default=6)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    report: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "frameworks": {}}
    for framework in args.frameworks.split(","):
        runs: dict[str, list[float]] = {}
        for _ in range(args.repeats):  # interleaved: every figure of a repeat measured at the same load
            runs.setdefault("bare_python_s", []).append(_timed([sys.executable, "-c", "pass"], os.environ.copy())[0])
            runs.setdefault("bare_import_s", []).append(
                _timed([sys.executable, "-c", BARE_OP[framework]], _env(framework))[0])
            for name, value in parts(framework).items():
                runs.setdefault(name, []).append(value)
            runs.setdefault("import_threads", []).append(import_threads(framework))
            runs.setdefault("probe_s", []).append(probe_s(framework))
            runs.setdefault("sweep_per_config_s", []).append(sweep(framework, args.configs))
            runs.setdefault("sweep_spawn_per_config_s", []).append(sweep(framework, args.configs, "spawn"))
        figures = {name: summary(values) for name, values in runs.items()}
        for ratio, sweep_s in (("sweep_ratio", "sweep_per_config_s"), ("spawn_ratio", "sweep_spawn_per_config_s")):
            figures[ratio] = summary([s / b for s, b in zip(runs[sweep_s], runs["bare_import_s"])])
        report["frameworks"][framework] = figures
        print(f"== {framework} (median [min, max] of {args.repeats})")
        for name, f in figures.items():
            print(f"  {name:24s} {f['median']:8.3f} [{f['min']:.3f}, {f['max']:.3f}]")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
