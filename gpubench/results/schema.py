"""The result schema (docs/results-schema.md): its version, the statuses, and the shape check
every result line passes when it is read (``Result.from_json``). Bump SCHEMA_VERSION on any
incompatible change."""

from __future__ import annotations

import json
import math
from typing import Any

from gpubench.config import config_problem

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = (1,)

STATUSES = ("ok", "oom", "unsupported", "unavailable", "diverged", "target_not_reached", "timeout", "error")
# the statuses whose figures are measurements (a run that missed its target trained at a measured rate)
MEASURED_STATUSES = ("ok", "target_not_reached")
FAILED_STATUSES = ("error", "timeout")  # the statuses that make `run` exit 1 (as nothing measured does)


def clean(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats become None (strict JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


# What every result line has, as (key, its types, the words for them); metrics may be null.
_REQUIRED: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("run_id", (str,), "a string"), ("config_id", (str,), "a string"), ("config", (dict,), "an object"),
    ("repeat", (int,), "an integer"), ("status", (str,), "a string"), ("reason", (str,), "a string"),
    ("metrics", (dict, type(None)), "an object or null"))
_LINE = ("a result line needs run_id, config_id (strings), config (an object with its framework), repeat (an integer), "
         f"status (one of: {', '.join(STATUSES)}), reason (a string) and metrics (an object or null)")
# The figures of a measurement that readers compute with (the gate, export, the report, a resumed
# run's summary and twin comparisons): numbers on every line with metrics.throughput, which an
# ok line must have; the two medians positive (the gate takes their logarithm).
MEASURED = ("metrics.throughput.median", "metrics.throughput.ci_low", "metrics.throughput.ci_high",
            "metrics.step_time_ms.median", "metrics.step_time_ms.cv", "metrics.cold_start_ms",
            "metrics.samples_per_step")
_POSITIVE = ("metrics.throughput.median", "metrics.step_time_ms.median")
# Figures that may be absent or null, but are numbers where present (peak memory, energy, the
# batch a "max" search found).
OPTIONAL = ("metrics.memory.peak_allocated_bytes", "metrics.memory.train_peak_rss_bytes",
            "metrics.memory.peak_rss_bytes", "metrics.batch_search.max_batch", "telemetry.gpu.energy_per_sample_j")


# Every other field readers use, by its kind; absent or null is fine, another type is not. A
# metric's declaration (results.metrics) declares its field here as it registers, so that a
# figure and its type are declared once.
FIELD_KINDS: dict[str, str] = {
    "metrics.loss.curve": "numbers", "metrics.loss.windows": "numbers", "metrics.window_steps": "integers",
    "metrics.window_wall_ms": "numbers", "metrics.target.evaluations": "evaluations", "metrics.peak": "object",
    "metrics.peak.per_device_tflops": "number", "metrics.cost": "object"}


def declare_field(dotted: str, kind: str) -> None:
    """``dotted``, where present, holds a ``kind`` (a key of _KIND_CHECKS: number, flag, text, a list...)."""
    if kind not in _KIND_CHECKS:
        raise ValueError(f"{dotted}: kind {kind!r} is not one of {', '.join(_KIND_CHECKS)}")
    FIELD_KINDS[dotted] = kind


def dig(d: Any, *path: str) -> Any:
    """``d[path[0]][path[1]]...``, or None where a key is absent or a step is not an object."""
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _kind(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {json.dumps(value, default=str)[:40]}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_KEYS: dict[str, list[str]] = {}  # each dotted path looked up, split


def _lookup(result: dict[str, Any], dotted: str) -> tuple[Any, str | None]:
    """(the value at a dotted path or None where absent, the problem where a step on the way is
    not an object)."""
    value: Any = result
    keys = _KEYS.get(dotted) or _KEYS.setdefault(dotted, dotted.split("."))
    for i, key in enumerate(keys):
        if value is None:
            return None, None
        if not isinstance(value, dict):
            return None, f"{'.'.join(keys[:i])!r} is {_kind(value)}, not an object"
        value = value.get(key)
    return value, None


def _evaluations(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(e, list) and len(e) == 3 and all(map(_is_number, e)) for e in v)


_KIND_CHECKS: dict[str, tuple[Any, str]] = {
    "number": (_is_number, "a number"), "flag": (lambda v: isinstance(v, bool), "true or false"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "numbers": (lambda v: isinstance(v, list) and _numbers_or_nulls(v), "a list of numbers"),
    "integers": (lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
                 "a list of integers"),
    "evaluations": (_evaluations, "a list of [steps, seconds, loss]"),
    "object": (lambda v: isinstance(v, dict), "an object"), "list": (lambda v: isinstance(v, list), "a list")}


def _typed_problem(result: dict[str, Any], dotted: str, kind: str) -> str | None:
    value, problem = _lookup(result, dotted)
    if problem or value is None:
        return problem
    ok, words = _KIND_CHECKS[kind]
    return None if ok(value) else f"{dotted!r} is {_kind(value)}, not {words}"


def _devices_problem(result: dict[str, Any]) -> str | None:
    """``env.frameworks.<name>.devices``: objects whose name and model are strings (a result's
    device model is looked up there)."""
    frameworks = dig(result, "env", "frameworks")
    if frameworks is None:
        return None
    if not isinstance(frameworks, dict) or not all(isinstance(p, (dict, type(None))) for p in frameworks.values()):
        return f"'env.frameworks' is {_kind(frameworks)}, not an object of objects"
    for name, probe in frameworks.items():
        devices = (probe or {}).get("devices")
        if devices is not None and not (isinstance(devices, list) and all(
                isinstance(d, dict) and all(isinstance(d.get(k), (str, type(None))) for k in ("name", "model"))
                for d in devices)):
            return f"'env.frameworks.{name}.devices' is {_kind(devices)}, not a list of objects with a name and model"
    return None


def _figure_problem(result: dict[str, Any], dotted: str, required: bool) -> str | None:
    value, problem = _lookup(result, dotted)
    if problem or (value is None and not required):
        return problem
    positive = dotted in _POSITIVE
    if _is_number(value) and (value > 0 or not positive):
        return None
    return f"{dotted!r} is {_kind(value)}, not {'a positive number' if positive else 'a number'}"


_PLAIN = {int, float, type(None)}  # the types a decoded list of numbers or nulls holds


def _numbers_or_nulls(values: list[Any]) -> bool:
    # the set of types first: one pass in C over a decoded line's step times
    return set(map(type, values)) <= _PLAIN or all(v is None or _is_number(v) for v in values)


def result_problem(result: dict[str, Any]) -> str | None:
    """What is wrong with the shape of a result line, or None. The store checks every line it
    loads, so that readers can index what a line must have without guarding each access."""
    for key, types, words in _REQUIRED:
        if key not in result:
            return f"{key!r} missing; {_LINE}"
        if not isinstance(result[key], types) or isinstance(result[key], bool):
            return f"{key!r} is {_kind(result[key])}, not {words}; {_LINE}"
    if result["status"] not in STATUSES:
        return f"status {result['status']!r}: expected one of: {', '.join(STATUSES)}"
    if not isinstance(result["config"].get("framework"), str):
        return f"'config.framework' is {_kind(result['config'].get('framework'))}, not a string; {_LINE}"
    # node r > 0 of a multi-node run records only its ranks' outcome (node.jsonl), no metrics
    node_line = _is_number(result.get("node_rank")) and result["node_rank"] > 0
    measured = (result["status"] == "ok" and not node_line) or _lookup(result, "metrics.throughput")[0] is not None
    for dotted in MEASURED if measured else ():
        if problem := _figure_problem(result, dotted, required=True):
            return f"{problem}; an ok result (or any with metrics.throughput) needs numbers at: {', '.join(MEASURED)}"
    for dotted in OPTIONAL:
        if problem := _figure_problem(result, dotted, required=False):
            return problem
    steps, problem = _lookup(result, "metrics.step_times_ms")
    if not problem and steps is not None and not (isinstance(steps, list) and _numbers_or_nulls(steps)):
        problem = f"'metrics.step_times_ms' is {_kind(steps)}, not a list of numbers"
    if problem or (problem := config_problem(result["config"])):
        return problem
    for dotted, kind in FIELD_KINDS.items():
        if problem := _typed_problem(result, dotted, kind):
            return problem
    return _devices_problem(result)
