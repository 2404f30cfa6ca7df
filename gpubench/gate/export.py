"""Export a run's results to the formats other CI tools read, with gpubench's own figures.

A config's figure is gpubench's: its throughput (samples/s), the median over its ok repeats,
each repeat a fresh process (the unit of replication of the gate, as in the report). The
exports carry that figure and the per-repeat figures behind it, never raw steps pooled over
the repeats (which made a noisy run's headline a different number from gpubench's):

- ``pytest-benchmark``: the JSON of ``pytest --benchmark-json``, one benchmark per config whose
  rounds are its repeats and whose "time" is seconds per sample (1 / that repeat's
  throughput). Its ``stats`` (which ``pytest-benchmark compare`` shows as stored, without
  recomputing them) are those of these rounds, except ``ops``, which is gpubench's
  throughput (pytest-benchmark's 1 / mean would be the repeats' harmonic mean), and
  ``median``, 1 / gpubench's throughput (the middle round's with an odd number of repeats;
  with an even one, a value between the two middle rounds);
- ``github-action``: the ``customBiggerIsBetter`` list of the common GitHub benchmark action
  (name, unit, value, range, extra): value gpubench's throughput in samples/s, range half the
  spread of the repeats (one repeat: half its within-process 95% CI), one entry per config.
"""

from __future__ import annotations

import math
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gpubench
from gpubench.errors import EXIT_OK, InputError
from gpubench.gate.sides import resolve
from gpubench.results.metrics import BY_NAME
from gpubench.results.outputs import check_output_file, write_output
from gpubench.results.result import Result
from gpubench.results.store import RESULTS_FILE, json_text

FORMATS = ("pytest-benchmark", "github-action")


THROUGHPUT, STEP = BY_NAME["throughput"], BY_NAME["step_ms"]


def _rate(r: Result) -> float | None:
    """A repeat's throughput, where it is ok and has a positive, finite one (as the gate takes it)."""
    v = THROUGHPUT.value(r) if r.ok else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf else None


def _ok_by_config(results: list[Result], source: str = "results") -> dict[str, list[Result]]:
    """The repeats with a throughput, by config. One name must stand for one config, or the
    exported figure would mix two configs under one name: an InputError naming ``source`` (a
    repeat written twice is refused where results are read)."""
    out: dict[str, list[Result]] = {}
    hashes: dict[str, str] = {}
    for r in results:
        if r.config_hash is not None and hashes.setdefault(r.config_id, r.config_hash) != r.config_hash:
            raise InputError(f"{source}: config id {r.config_id} names two configs (hashes "
                             f"{hashes[r.config_id]} and {r.config_hash}); an export needs one name per config")
        if _rate(r) is not None:
            out.setdefault(r.config_id, []).append(r)
    return out


def _rates(rs: list[Result]) -> list[float]:
    return [v for r in rs if (v := _rate(r)) is not None]


def to_pytest_benchmark(results: list[Result], env: dict[str, Any], source: str = "results") -> dict[str, Any]:
    try:
        from pytest_benchmark import __version__ as pb_version
        from pytest_benchmark.stats import Stats
    except ImportError:
        raise InputError("--format pytest-benchmark needs pytest-benchmark (pip install pytest-benchmark)") from None
    benchmarks = []
    for config_id, rs in _ok_by_config(results, source).items():
        rates = _rates(rs)
        stats = Stats()
        for rate in rates:
            stats.update(1.0 / rate)  # seconds per sample: pytest-benchmark's "time" of a round
        d = stats.as_dict()
        value = statistics.median(rates)
        d["ops"], d["median"] = value, 1.0 / value  # gpubench's figure (module docstring)
        d["data"] = stats.data
        d["iterations"] = 1
        first = rs[0]
        benchmarks.append({
            "group": first.config.get("workload"),
            "name": config_id,
            "fullname": f"gpubench::{config_id}",
            "params": None,
            "param": None,
            "extra_info": {"unit": "seconds per sample; ops: samples/s", "throughput_median": value,
                           "throughput_per_repeat": rates, "repeats": len(rates),
                           "samples_per_step": first.get("metrics", "samples_per_step"),
                           "run_id": first.run_id, "framework": first.framework,
                           "device": first.config.get("device")},
            "options": {"timer": "gpubench: 1 / a repeat's throughput", "min_rounds": None, "warmup": True},
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


def _spread(rs: list[Result], rates: list[float]) -> float | None:
    """Half the spread of the repeats; one repeat: half its within-process 95% CI (None where
    the result has none)."""
    if len(rates) > 1:
        return (max(rates) - min(rates)) / 2
    low, high = BY_NAME["throughput_ci_low"].value(rs[0]), BY_NAME["throughput_ci_high"].value(rs[0])
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and math.isfinite(high - low):
        return (high - low) / 2
    return None


def to_github_action(results: list[Result], source: str = "results") -> list[dict[str, Any]]:
    out = []
    for config_id, rs in _ok_by_config(results, source).items():
        rates = _rates(rs)
        entry: dict[str, Any] = {"name": config_id, "unit": "samples/s", "value": round(statistics.median(rates), 3)}
        spread = _spread(rs, rates)
        if spread is not None:  # "±N": the action reads the number after the sign
            entry["range"] = f"±{round(spread, 3)}"
        steps = [float(v) for r in rs if isinstance(v := STEP.value(r), (int, float))]
        entry["extra"] = (f"median of {len(rates)} repeat(s), each a fresh process"
                          + (f"; median step {statistics.median(steps):.4g} ms" if steps else ""))
        out.append(entry)
    return out


def run_export(run_dir: Path, fmt: str, out: Path | None) -> int:
    """``gpubench export``: to ``out`` (checked first, written atomically), else stdout."""
    check_output_file(out, "--out")
    side = resolve(str(run_dir), None)  # run directories only: export takes no baseline names
    source = str(side.path / RESULTS_FILE)
    data = (to_pytest_benchmark(side.results, side.env, source) if fmt == "pytest-benchmark"
            else to_github_action(side.results, source))
    text = json_text(data)
    if out is None:
        sys.stdout.write(text)
    else:
        write_output(out, text, "--out")
    return EXIT_OK
