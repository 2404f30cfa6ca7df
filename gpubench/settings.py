"""A suite's settings: each one's type, check and default (SETTINGS, from gpubench.config's
declarations), and the checks of the values a suite, ``--set`` or a run.json gives them. Every
check names what is allowed; gpubench.suite reads a suite through them."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpubench.backends import BACKENDS, declared_values
from gpubench.config import MAX_BATCH, SETTING_FIELDS
from gpubench.errors import choices_message
from gpubench.options import parse_parallelism
from gpubench.workloads import WORKLOADS
from gpubench.workloads.source import is_function_ref, parse_workload

_DEVICE_RE = re.compile(r"^(cpu|cuda|gpu)(:(\d+))?$")


Check = Callable[[Any], Any]  # returns the normalised value or raises ValueError(message)


INT_MAX = 2**31 - 1  # a tensor dimension, a step count: beyond it the frameworks fail mid-run


def _int(minimum: int, maximum: int = INT_MAX) -> Check:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"expected an integer >= {minimum}, got {v!r}")
        if v < minimum:
            raise ValueError(f"must be >= {minimum}, got {v}")
        if v > maximum:
            raise ValueError(f"must be <= {maximum}, got {v}")
        return v
    return check


def _batch_size(v: Any) -> int | str:
    if v == MAX_BATCH:
        return v
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f'expected an integer >= 1 or "{MAX_BATCH}", got {v!r}')
    if not 1 <= v <= INT_MAX:
        raise ValueError(f'must be 1..{INT_MAX} or "{MAX_BATCH}", got {v}')
    return v


def _positive_float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a positive number, got {v!r}")
    if not v > 0:
        raise ValueError(f"must be > 0, got {v}")
    if v == math.inf:
        raise ValueError(f"must be finite, got {v}")
    return float(v)


def _fraction(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number in [0, 1), got {v!r}")
    if not 0 <= v < 1:
        raise ValueError(f"must be >= 0 and < 1, got {v}")
    return float(v)


def _non_negative_float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number >= 0, got {v!r}")
    if not 0 <= v < math.inf:
        raise ValueError(f"must be >= 0 and finite, got {v}")
    return float(v)


@dataclass(frozen=True)
class Choice:
    """A check that a value is one of ``allowed``: a tuple, or a callable read when checked
    (so that a plugin can add values)."""

    kind: str
    allowed: Callable[[], list[str]] | tuple[str, ...]

    def values(self) -> list[str]:
        return list(self.allowed() if callable(self.allowed) else self.allowed)

    def __call__(self, v: Any) -> str:
        options = self.values()
        if not isinstance(v, str) or v not in options:
            raise ValueError(choices_message(self.kind, v, options))
        return v


def parse_device(v: Any) -> str:
    """``cpu``, ``cuda``, ``cuda:N`` (``gpu``, ``gpu:N`` are aliases): for suites and ``calibrate --device``."""
    m = _DEVICE_RE.match(v) if isinstance(v, str) else None
    if not m:
        raise ValueError(f"unknown device {v!r}; expected one of: cpu, cuda, cuda:N (gpu and gpu:N are aliases)")
    kind = "cuda" if m.group(1) == "gpu" else m.group(1)
    if kind == "cpu" and m.group(2):
        raise ValueError(f"unknown device {v!r}; expected one of: cpu, cuda, cuda:N")
    return kind + (m.group(2) or "")


def _parallelism(v: Any) -> str:
    parse_parallelism(v)  # raises ValueError naming the allowed forms
    return v


def _string(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string, got {v!r}")
    return v


def _workload(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a workload name, got {v!r}")
    parse_workload(v, sorted(WORKLOADS))  # raises ValueError naming the three forms
    return v


def check_input_shape(v: Any) -> tuple[int, ...]:
    """One sample's shape: a list of integers >= 1 (``[3, 32, 32]``), or ``"3x32x32"`` (--set)."""
    if isinstance(v, str):
        try:
            v = [int(p) for p in v.lower().split("x")]
        except ValueError:
            raise ValueError(f'expected a list of integers such as [3, 32, 32] (or "3x32x32"), got {v!r}') from None
    if not isinstance(v, (list, tuple)) or not v or len(v) > 8 or any(
            isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= INT_MAX for d in v):
        raise ValueError(f"expected a list of 1 to 8 integers >= 1 (one sample's shape, e.g. [3, 32, 32]), got {v!r}")
    return tuple(v)


def _function_ref(key: str) -> Check:
    def check(v: Any) -> str:
        if not isinstance(v, str) or (v and not is_function_ref(v)):
            raise ValueError(f'{key}: expected "module:function" (a function in the suite\'s directory or on '
                             f"PYTHONPATH), got {v!r}")
        return v
    return check


def _loss_output(v: Any) -> str:
    """``loss_output``: a field or key name, or a tuple's position (an integer, or its digits)."""
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return str(v)
    if isinstance(v, str) and (v == "" or v.isdigit() or v.isidentifier()):
        return v
    raise ValueError(f"loss_output: expected the name of the output's field or key holding the loss (\"loss\") or "
                     f"a tuple's position (1), got {v!r}")


def _declared_or_function(name: str, kind: str, function: str) -> Check:
    """A value some backend declares, or the user's ``"module:function"`` (``function``: what it does)."""
    def check(v: Any) -> str:
        if isinstance(v, str) and is_function_ref(v):
            return v
        try:
            return Choice(kind, lambda: declared_values(name))(v)
        except ValueError as e:
            raise ValueError(f'{e}, or a function "module:function" {function}') from None
    return check


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def _parse_bool(s: str) -> Any:
    return {"true": True, "false": False}.get(s.lower(), s)


ARGS_PREFIX = "args."  # args.<name>: a factory's keyword argument
ARG_RE = re.compile(r"^args\.[A-Za-z_][A-Za-z0-9_]*$")


def flatten_args(table: dict[str, Any]) -> dict[str, Any]:
    """``args = {width = 16}`` (TOML's ``args.width = 16``) as the key ``args.width``."""
    out = {}
    for key, value in table.items():
        if key == "args" and isinstance(value, dict):
            out.update({f"{ARGS_PREFIX}{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class Setting:
    name: str
    check: Check
    parse: Callable[[str], Any]  # from a --set string
    help: str


def parse_number(s: str) -> Any:
    try:
        return int(s)
    except ValueError:
        try:
            return float(s)
        except ValueError:
            return s


def _check_of(name: str, spec: tuple[Any, ...]) -> tuple[Check, Callable[[str], Any]]:
    """A declared check (``setting(check=...)`` in gpubench.config) as (the check of a suite's
    value, the parser of a ``--set`` string)."""
    kind, *args = spec
    if kind == "int":
        return _int(*args), parse_number
    numbers: dict[str, Check] = {"positive": _positive_float, "fraction": _fraction,
                                 "non_negative": _non_negative_float, "batch_size": _batch_size}
    if kind in numbers:
        return numbers[kind], parse_number
    if kind == "input_shape":
        return check_input_shape, check_input_shape
    if kind == "loss_output":
        return _loss_output, str
    if kind == "bool":
        return _bool, _parse_bool
    checks: dict[str, Callable[[], Check]] = {
        "workload": lambda: _workload,
        "registered": lambda: Choice(name, lambda: sorted(BACKENDS)),
        "device": lambda: parse_device,
        "parallelism": lambda: _parallelism,
        "string": lambda: _string,
        "declared": lambda: Choice(args[0], lambda: declared_values(name)),  # the values some backend supports
        "declared_or_function": lambda: _declared_or_function(name, args[0], args[2]),
        "values": lambda: Choice(args[0], tuple(args[1])),
        "function": lambda: _function_ref(args[0]),
    }
    if kind not in checks:
        raise ValueError(f"setting {name}: unknown check {kind!r}")
    return checks[kind](), str


# every suite key, from its one declaration (gpubench.config.setting)
SETTINGS: dict[str, Setting] = {f.name: Setting(f.name, *_check_of(f.name, f.metadata["check"]), f.metadata["help"])
                                for f in SETTING_FIELDS if f.metadata["check"] is not None}


def workload_param_names() -> list[str]:
    return sorted({p.name for w in WORKLOADS.values() for p in w.params})


def known_keys() -> list[str]:
    return list(SETTINGS) + workload_param_names()


def check_value(key: str, value: Any) -> Any:
    """Validate one value of a setting or workload parameter; raise ValueError(message)."""
    if key in SETTINGS:
        return SETTINGS[key].check(value)
    if ARG_RE.match(key):
        if not isinstance(value, (bool, int, float, str)):
            raise ValueError(f"a factory's argument is a string, number or boolean, got {value!r}")
        return value
    minimum = min(p.minimum for w in WORKLOADS.values() for p in w.params if p.name == key)
    return _int(minimum)(value)
