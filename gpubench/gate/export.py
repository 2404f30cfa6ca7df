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
from gpubench.results.outputs import check_output_file, write_output
from gpubench.results.store import json_text

FORMATS = ("pytest-benchmark", "github-action")


def _ok_by_config(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The ok results that hold at least one step time, by config."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r["status"] == "ok" and any(t is not None for t in (r["metrics"] or {}).get("step_times_ms") or ()):
            out.setdefault(r["config_id"], []).append(r)
    return out


def to_pytest_benchmark(results: list[dict[str, Any]], env: dict[str, Any]) -> dict[str, Any]:
    try:
        from pytest_benchmark import __version__ as pb_version
        from pytest_benchmark.stats import Stats
    except ImportError:
        raise InputError("--format pytest-benchmark needs pytest-benchmark (pip install pytest-benchmark)") from None
    benchmarks = []
    for config_id, rs in _ok_by_config(results).items():
        stats = Stats()
        for r in rs:
            for t in r["metrics"]["step_times_ms"]:
                if t is not None:
                    stats.update(t / 1000.0)
        d = stats.as_dict()
        d["data"] = stats.data
        d["iterations"] = 1
        first = rs[0]
        benchmarks.append({
            "group": first["config"].get("workload"),
            "name": config_id,
            "fullname": f"gpubench::{config_id}",
            "params": None,
            "param": None,
            "extra_info": {"samples_per_step": first["metrics"]["samples_per_step"], "repeats": len(rs),
                           "throughput_median": statistics.median(r["metrics"]["throughput"]["median"] for r in rs),
                           "run_id": first.get("run_id"), "framework": first["config"].get("framework"),
                           "device": first["config"].get("device")},
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


def to_github_action(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for config_id, rs in _ok_by_config(results).items():
        rates = [r["metrics"]["throughput"]["median"] for r in rs]
        value = statistics.median(rates)
        if len(rs) == 1:
            tp = rs[0]["metrics"]["throughput"]
            spread = (tp["ci_high"] - tp["ci_low"]) / 2
        else:
            spread = (max(rates) - min(rates)) / 2
        step = statistics.median(r["metrics"]["step_time_ms"]["median"] for r in rs)
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
