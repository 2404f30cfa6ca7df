"""Export a run's results to the formats other CI tools read.

- ``pytest-benchmark``: the JSON that ``pytest --benchmark-json`` writes, one benchmark per
  config (its raw step times, in seconds, as the rounds), so ``pytest-benchmark compare``
  and its ``--benchmark-compare-fail`` work on gpubench runs;
- ``github-action``: the ``customBiggerIsBetter`` list of the common GitHub benchmark action
  (name, unit, value, range, extra), throughput in samples/s.
"""

from __future__ import annotations

import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gpubench
from gpubench.errors import InputError
from gpubench.results.metrics import metric
from gpubench.results.outputs import check_output_file, write_output
from gpubench.results.result import Result
from gpubench.results.store import json_text

FORMATS = ("pytest-benchmark", "github-action")


THROUGHPUT, STEP = metric("throughput"), metric("step_ms")


def _step_times(r: Result) -> list[float]:
    return [t for t in r.get("metrics", "step_times_ms") or () if t is not None]


def _ok_by_config(results: list[Result]) -> dict[str, list[Result]]:
    """The ok results that hold at least one step time, by config."""
    out: dict[str, list[Result]] = {}
    for r in results:
        if r.ok and _step_times(r):
            out.setdefault(r.config_id, []).append(r)
    return out


def to_pytest_benchmark(results: list[Result], env: dict[str, Any]) -> dict[str, Any]:
    try:
        from pytest_benchmark import __version__ as pb_version
        from pytest_benchmark.stats import Stats
    except ImportError:
        raise InputError("--format pytest-benchmark needs pytest-benchmark (pip install pytest-benchmark)") from None
    benchmarks = []
    for config_id, rs in _ok_by_config(results).items():
        stats = Stats()
        for r in rs:
            for t in _step_times(r):
                stats.update(t / 1000.0)
        d = stats.as_dict()
        d["data"] = stats.data
        d["iterations"] = 1
        first = rs[0]
        benchmarks.append({
            "group": first.config.get("workload"),
            "name": config_id,
            "fullname": f"gpubench::{config_id}",
            "params": None,
            "param": None,
            "extra_info": {"samples_per_step": first.get("metrics", "samples_per_step"), "repeats": len(rs),
                           "throughput_median": statistics.median(THROUGHPUT.value(r) for r in rs),
                           "run_id": first.run_id, "framework": first.framework,
                           "device": first.config.get("device")},
            "options": {"timer": "gpubench step timer", "min_rounds": None, "warmup": True},
            "stats": d,
        })
    git = env.get("git") or {}
    return {
        "machine_info": {"node": env.get("hostname"), "processor": env.get("cpu_model"),
                         "python_version": env.get("python"), "cpu": {"brand_raw": env.get("cpu_model"),
                                                                       "count": env.get("cpu_logical_cores")},
                         "gpus": env.get("gpus"), "gpubench": gpubench.__version__},
        "commit_info": {"id": git.get("commit"), "dirty": git.get("dirty"), "project": "gpubench"},
        "benchmarks": benchmarks,
        "datetime": datetime.now(timezone.utc).isoformat(),
        "version": pb_version,
    }


def to_github_action(results: list[Result]) -> list[dict[str, Any]]:
    out = []
    for config_id, rs in _ok_by_config(results).items():
        rates = [THROUGHPUT.value(r) for r in rs]
        value = statistics.median(rates)
        if len(rs) == 1:
            spread = (metric("throughput_ci_high").value(rs[0]) - metric("throughput_ci_low").value(rs[0])) / 2
        else:
            spread = (max(rates) - min(rates)) / 2
        step = statistics.median(STEP.value(r) for r in rs)
        out.append({"name": config_id, "unit": "samples/s", "value": round(value, 3),
                    "range": f"±{spread:.3g}", "extra": f"median step {step:.4g} ms; {len(rs)} repeat(s)"})
    return out


def run_export(run_dir: Path, fmt: str, out: Path | None) -> int:
    """``gpubench export``: to ``out`` (checked first, written atomically), else stdout."""
    from gpubench.gate.sides import resolve

    check_output_file(out, "--out")
    side = resolve(str(run_dir), None)  # run directories only: export takes no baseline names
    data = to_pytest_benchmark(side.results, side.env) if fmt == "pytest-benchmark" else to_github_action(side.results)
    text = json_text(data)
    if out is None:
        sys.stdout.write(text)
    else:
        write_output(out, text, "--out")
    return 0
