"""Suites: TOML loading, validation, matrix expansion into frozen Configs.

Every setting has a type, a check and (mostly) a default. A suite sets defaults in
``[defaults]`` and sweeps settings in ``[matrix]``; ``include``/``exclude`` tables in the
matrix add or remove points. All validation lives here and names the file, the key and the
allowed values, so that a bad suite fails before any process is started or any directory
is made.

Expansion rules (also in the README):
- the matrix is the product of its axes; ``exclude`` entries remove the points that match
  every key they name (a list value matches any of its values);
- ``include`` entries then add points: the keys an entry names take its values (lists expand),
  the keys it leaves out range over the matrix's values;
- workload parameters (``depth``, ``width``...) apply only to the workloads that take them;
  duplicate points are dropped, first one kept;
- ``--set KEY=V1,V2`` replaces an axis (or a default) and narrows ``include`` entries to those
  values.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from gpubench.backends import resolve_best_compile
from gpubench.config import DEFAULTS, MAX_BATCH, NAMEABLE, Config
from gpubench.errors import InputError, choices_message
from gpubench.files import file_stem, read_user_text
from gpubench.settings import (
    ARG_RE,
    ARGS_PREFIX,
    SETTINGS,
    check_input_shape,
    check_value,
    flatten_args,
    known_keys,
    parse_number,
    workload_param_names,
)
from gpubench.workloads import WORKLOADS
from gpubench.workloads.data import task_loss_floor

# the most config repeats one sweep may have unless --max-jobs raises it: each is a fresh process
# of seconds to minutes, so this is a day or more of training, and a matrix far above it is a
# mistake (10^10 points would take the machine's memory before the first config ran)
MAX_JOBS = 10_000
# the most config repeats a sweep may have whatever --max-jobs says: planning holds every config
# in memory (about 4 KB each: 0.4 GB here), and a sweep beyond it would run for months
MAX_PLANNED = 100_000

_TOP_KEYS = ("name", "description", "defaults", "matrix", "telemetry")
_TELEMETRY_KEYS = {"interval_ms": "telemetry_interval_ms"}  # [telemetry] key -> setting


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    source: str  # file path, for messages
    defaults: dict[str, Any] = field(default_factory=dict)
    matrix: dict[str, list[Any]] = field(default_factory=dict)
    include: tuple[dict[str, list[Any]], ...] = ()
    exclude: tuple[dict[str, list[Any]], ...] = ()
    overrides: dict[str, list[Any]] = field(default_factory=dict)  # from --set, for narrowing includes
    max_jobs: int = MAX_JOBS  # the most config repeats a sweep of it may have (run --max-jobs)

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "include": list(self.include),
                "exclude": list(self.exclude)}

    @staticmethod
    def from_dict(d: Any, src: str = "run.json") -> Suite:
        """The suite a run directory stored (``to_dict``), checked again as a suite file is:
        a hand-edited or damaged run.json fails here with its key, not midway through a run."""
        where = f"{src}: suite"
        if not isinstance(d, dict):
            raise InputError(f"{where}: expected an object, got {type(d).__name__}")
        matrix = _table(d, "matrix", where)
        data = {"name": d.get("name"), "description": d.get("description", ""), "defaults": d.get("defaults", {}),
                "matrix": {**matrix, "include": d.get("include", []), "exclude": d.get("exclude", [])}}
        max_jobs = d.get("max_jobs", MAX_JOBS)
        if isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or not 1 <= max_jobs <= MAX_PLANNED:
            raise InputError(f"{where}.max_jobs: expected an integer from 1 to {MAX_PLANNED:,}, got {max_jobs!r}")
        suite = parse_suite(data, where, max_jobs=max_jobs)
        overrides = {k: _values(f"{where}.overrides.{k}", k, v) for k, v in _table(d, "overrides", where).items()}
        source = d.get("source")
        return replace(suite, source=source if isinstance(source, str) else src, overrides=overrides)

    # --- overrides -------------------------------------------------------------------------

    def with_overrides(self, sets: list[str]) -> Suite:
        """Apply ``--set KEY=V1,V2`` strings (validated; InputError on a bad one)."""
        defaults, matrix, overrides = dict(self.defaults), dict(self.matrix), dict(self.overrides)
        for item in sets:
            key, sep, raw = item.partition("=")
            key = key.strip()
            where = f"--set {item}"
            if not sep or not key or not raw.strip():
                raise InputError(f"{where}: expected KEY=VALUE[,VALUE...]")
            _known(where, key)
            parse = SETTINGS[key].parse if key in SETTINGS else parse_number
            values = [_validated(where, key, parse(v.strip())) for v in raw.split(",")]
            if key == "input_shape" and len(values) > 1 and "x" not in raw:  # --set input_shape=3,32,32
                values = [_validated(where, key, [v for shape in values for v in shape])]
            overrides[key] = values
            if key in matrix or len(values) > 1:
                matrix[key] = values
                defaults.pop(key, None)
            else:
                defaults[key] = values[0]
        suite = replace(self, defaults=defaults, matrix=matrix, overrides=overrides)
        for item in sets:  # a parameter set here that no workload of the suite takes is a typo
            suite.check_params_used(keys={item.partition("=")[0].strip()}, where=f"--set {item}")
        suite.expand()  # surface expansion errors now
        return suite

    # --- expansion -------------------------------------------------------------------------

    def size(self) -> int:
        """Points of the matrix before ``exclude`` and de-duplication: what expansion would
        build, computed without building it."""
        axes = _ordered_axes(self.matrix)
        total = math.prod(len(self.matrix[a]) for a in axes)
        for included in self.include:
            entry = self._narrow(included)
            if entry is not None:
                total += math.prod(len(v) for v in entry.values()) * math.prod(
                    len(self.matrix[a]) for a in axes if a not in entry)
        return total

    def check_size(self, repeats: int = 1) -> None:
        """Refuse a sweep of more than ``max_jobs`` config repeats before anything is built (a
        matrix of 10^10 points would otherwise take the machine's memory), naming the axes."""
        points = self.size()
        if points * repeats <= min(self.max_jobs, MAX_PLANNED):
            return
        axes = ", ".join(f"{a} {len(self.matrix[a])}" for a in _ordered_axes(self.matrix)) or "none"
        extra = f", {len(self.include)} include entries" if self.include else ""
        times = f" x {repeats} repeats = {points * repeats:,} jobs" if repeats > 1 else ""
        raise InputError(f"{self.source}: the sweep has up to {points:,} points (before exclude){times} "
                         f"(matrix axes and their lengths: {axes}{extra}), above the cap of "
                         f"{min(self.max_jobs, MAX_PLANNED):,} config repeats; narrow it with --set"
                         + (", or raise the cap with --max-jobs N" if self.max_jobs < MAX_PLANNED else
                            f" (no sweep may have more than {MAX_PLANNED:,}: planning holds every config in memory, "
                            "about 4 KB each)"))

    def expand(self) -> list[Config]:
        """All configs of the sweep, in a stable order, without duplicates, each with an id no
        other config of the sweep has."""
        self.check_size()
        axes = _ordered_axes(self.matrix)
        base = [dict(zip(axes, combo)) for combo in itertools.product(*(self.matrix[a] for a in axes))]
        # exclude: the points that match every key an entry names
        points = [p for p in base if not any(all(k in p and p[k] in vs for k, vs in e.items()) for e in self.exclude)]
        for included in self.include:
            entry = self._narrow(included)
            if entry is None:
                continue
            free = [a for a in axes if a not in entry]
            keys = list(entry) + free
            lists = [entry[k] for k in entry] + [self.matrix[a] for a in free]
            points += [dict(zip(keys, combo)) for combo in itertools.product(*lists)]
        if not points:
            raise InputError(f"{self.source}: the matrix is empty after include/exclude")
        configs = dict.fromkeys(resolve_best_compile(config_from({**self.defaults, **p}, self.source)).normalised()
                                for p in points)
        return name_differences(list(configs), self.source)  # without duplicates, the first kept

    def _narrow(self, entry: dict[str, list[Any]]) -> dict[str, list[Any]] | None:
        out = {}
        for k, vs in entry.items():
            if k in self.overrides:
                vs = [v for v in vs if v in self.overrides[k]]
                if not vs:
                    return None
            out[k] = vs
        return out

    def check_params_used(self, keys: set[str] | None = None, where: str | None = None) -> None:
        """A workload parameter no workload of the suite takes is a mistake (a typo, or the
        wrong workload): say which workloads take which parameters. ``keys``: only these (the
        ones a ``--set`` gave), else every key of the suite. Without any workload there is
        nothing to check (expansion reports the missing key)."""
        named = [*self.matrix.get("workload", []), self.defaults.get("workload"),
                 *(w for e in self.include for w in e.get("workload", []))]
        used_workloads: set[str] = {w for w in named if isinstance(w, str)}
        if not used_workloads:
            return
        takes = {p.name for w in used_workloads if w in WORKLOADS for p in WORKLOADS[w].params}
        if keys is None:
            keys = set(self.defaults) | set(self.matrix) | {k for e in self.include for k in e}
        if any(w not in WORKLOADS for w in used_workloads):  # a factory or a zoo's model takes args.*
            takes |= {k for k in keys if k.startswith(ARGS_PREFIX)}
        for key in sorted(keys & ({*workload_param_names()} | {k for k in keys if k.startswith(ARGS_PREFIX)})
                          - takes):
            offered = "; ".join(f"{w} takes: {', '.join(WORKLOADS[w].param_names()) or 'none'}"
                                if w in WORKLOADS else f"{w} takes: args.<name>" for w in sorted(used_workloads))
            prefix = where or f"{self.source}: {key}"
            raise InputError(f"{prefix}: no workload in this suite takes '{key}' ({offered})")


def config_from(values: dict[str, Any], source: str) -> Config:
    """One config from validated settings (suite keys, a built-in workload's parameters, a
    factory's ``args.<name>``)."""
    if "workload" not in values:
        raise InputError(f"{source}: missing key 'workload' (set it in [matrix] or [defaults]); "
                         f"expected one of: {', '.join(sorted(WORKLOADS))}, \"module:function\" or \"zoo:name\"")
    if values["workload"] in WORKLOADS:
        workload = WORKLOADS[values["workload"]]
        params = tuple(sorted((p.name, values.get(p.name, p.default)) for p in workload.params))
        try:  # parameters that do not fit together (heads that do not divide the width)
            spec = workload.spec(**dict(params))
            spec.shapes()
        except ValueError as e:
            raise InputError(f"{source}: {e}") from None
        target, synthetic = values.get("target_loss", 0.0), values.get("dataset", DEFAULTS["dataset"]) == "synthetic"
        if target and synthetic and target < (floor := task_loss_floor(spec)):
            raise InputError(f"{source}: target_loss {target:g} is below the {workload.name} task's floor "
                             f"{floor:.4f} (the entropy of its random labels: no model's held-out loss goes lower "
                             "on average); expected a number above it")
    else:  # a factory's or a zoo's model: its keyword arguments
        params = tuple(sorted((k[len(ARGS_PREFIX):], v) for k, v in values.items() if k.startswith(ARGS_PREFIX)))
    settings = {k: v for k, v in values.items() if k in SETTINGS}
    config = Config(**settings, workload_params=params)
    _check_data_keys(config, source)
    if config.batch_size == MAX_BATCH and config.max_batch_limit < config.max_batch_start:
        raise InputError(f"{source}: max_batch_limit ({config.max_batch_limit}) is below max_batch_start "
                         f"({config.max_batch_start}); the batch_size = \"max\" search needs start <= limit")
    return config


def _check_data_keys(config: Config, source: str) -> None:
    """The data keys that only go together: a held-out split of the user's data set, one source
    of training data, a target evaluated on a held-out split."""
    user = ":" in config.dataset
    if config.held_out and not user:
        raise InputError(f"{source}: held_out: a held-out split goes with your data set (dataset = "
                         f"\"module:function\"), not dataset = {config.dataset!r}")
    if user and config.batches:
        raise InputError(f"{source}: batches: one source of training data: dataset = {config.dataset!r} or batches "
                         f"= {config.batches!r}, not both")
    if user and config.target_loss > 0 and not config.held_out:
        raise InputError(f"{source}: held_out: target_loss on dataset = {config.dataset!r} is evaluated on a held-out "
                         "split; name its function (held_out = \"module:function\")")


def suite_text(name: str, settings: dict[str, Any]) -> str:
    """A suite file's text for keyword settings (the pytest fixtures, the Python API): a list
    sweeps its key (``[matrix]``), except one ``input_shape``; ``args={"width": 16}`` gives a
    factory's arguments. Raises InputError for a value TOML cannot hold here."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if key == "args":
            if not isinstance(value, dict):
                raise InputError(f"{name}: args: expected a dict of a factory's keyword arguments, got {value!r}")
            flat.update({f"{ARGS_PREFIX}{k}": v for k, v in value.items()})
        elif key == "input_shape" and isinstance(value, (tuple, list)) and _flat_list(list(value)):
            flat[key] = check_input_shape(list(value))
        else:
            flat[key] = value

    def toml(key: str, v: Any) -> str:
        if isinstance(v, tuple):  # one input_shape
            return f"[{', '.join(map(str, v))}]"
        if not isinstance(v, (str, int, float, bool)):
            raise InputError(f"{name}: {key}: expected a string, number or boolean, got {v!r}")
        return json.dumps(v)  # a JSON string, number or boolean is a TOML one

    lines = [f"name = {json.dumps(name)}", "[defaults]"]
    lines += [f"{json.dumps(k)} = {toml(k, v)}" for k, v in flat.items() if not isinstance(v, list)]
    lines += ["[matrix]"] + [f"{json.dumps(k)} = [{', '.join(toml(k, x) for x in v)}]"
                             for k, v in flat.items() if isinstance(v, list)]
    return "\n".join(lines) + "\n"


def name_differences(configs: list[Config], source: str) -> list[Config]:
    """The configs, each with the settings that tell it from the other points of the sweep
    with the same base id (``Config.id_keys``: a seed, steps, timeout_s... that the sweep
    varies), so that every config has an id of its own while a setting the whole sweep shares
    stays out of the ids. Raises InputError where two configs would still share an id or a file
    name (cannot happen for configs that differ: every setting is named where it differs)."""
    groups: dict[str, list[Config]] = {}
    for c in configs:
        groups.setdefault(replace(c, id_keys=()).config_id, []).append(c)
    named: dict[Config, Config] = {}
    for members in groups.values():
        keys = tuple(k for k in NAMEABLE if len({getattr(c, k) for c in members}) > 1)
        named.update({c: replace(c, id_keys=keys) for c in members})
    out = [named[c] for c in configs]
    files: dict[str, Config] = {}  # one id, one stem: so two equal ids share a stem too
    for c in out:
        stem = file_stem(c.config_id).lower()
        if stem in files:
            raise InputError(f"{source}: two configs of the sweep would share the id or file name {c.config_id!r} "
                             f"({files[stem].to_dict()} and {c.to_dict()}); please report this")
        files[stem] = c
    return out


_AXIS_ORDER = ("workload", "framework", "device", "precision", "batch_size", "parallelism")


def _ordered_axes(matrix: dict[str, list[Any]]) -> list[str]:
    return [a for a in _AXIS_ORDER if a in matrix] + [a for a in matrix if a not in _AXIS_ORDER]


def _validated(where: str, key: str, value: Any) -> Any:
    try:
        return check_value(key, value)
    except ValueError as e:
        raise InputError(f"{where}: {e}") from None


# --- loading --------------------------------------------------------------------------------

def load_suite(name_or_path: str, max_jobs: int = MAX_JOBS) -> Suite:
    """A suite file (a path, or a bare suite name looked up as suites/<name>.toml), validated and
    expanded once (so that a bad one fails here); ``max_jobs`` bounds the sweep (--max-jobs)."""
    path = Path(name_or_path)
    if not (path.exists() or path.suffix == ".toml" or "/" in name_or_path):
        path = Path("suites") / f"{name_or_path}.toml"
    src = str(path)
    if not path.exists():
        raise InputError(f"{src}: no such suite file")
    text = read_user_text(path, "suite")  # a FIFO, a device, a directory, not UTF-8: one line
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{src}: invalid TOML: {e}") from None
    except RecursionError:
        raise InputError(f"{src}: invalid TOML: nested too deeply") from None
    except ValueError as e:  # tomllib's own, past its checks: an integer of more than 4300 digits
        raise InputError(f"{src}: invalid TOML: {str(e).split(';')[0]}") from None
    suite = parse_suite(data, src, default_name=path.stem, max_jobs=max_jobs)
    # a typo check for a hand-written file; a stored suite (run.json) may hold a parameter that a
    # --set narrowing left without its workload
    suite.check_params_used()
    return suite


MAX_NAME_CHARS = 100


def parse_suite(data: dict[str, Any], src: str, default_name: str = "suite", max_jobs: int = MAX_JOBS) -> Suite:
    for key in data:
        if key not in _TOP_KEYS:
            raise InputError(f"{src}: {choices_message('top-level key', key, list(_TOP_KEYS))}")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise InputError(f"{src}: name: expected letters, digits, '_', '.' or '-', got {name!r}")
    if len(name) > MAX_NAME_CHARS:  # run directories are named after it, and file names have a limit
        missing = "" if "name" in data else "; the file name stands in for a missing name"
        raise InputError(f"{src}: name: at most {MAX_NAME_CHARS} characters (run directories are named after it), "
                         f"got {len(name)}{missing}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise InputError(f"{src}: description: expected a string, got {description!r}")

    defaults_raw = dict(_table(data, "defaults", src))
    for key, value in _table(data, "telemetry", src).items():
        if key not in _TELEMETRY_KEYS:
            raise InputError(f"{src}: telemetry.{key}: {choices_message('key', key, list(_TELEMETRY_KEYS))}")
        defaults_raw[_TELEMETRY_KEYS[key]] = value
    defaults = {}
    for key, value in flatten_args(defaults_raw).items():
        where = f"{src}: defaults.{key}"
        _known(where, key)
        if isinstance(value, (list, dict)) and not (key == "input_shape" and _flat_list(value)):
            raise InputError(f"{where}: expected a single value (sweep lists belong in [matrix])")
        defaults[key] = _validated(where, key, value)

    matrix: dict[str, list[Any]] = {}
    entries: dict[str, list[dict[str, list[Any]]]] = {"include": [], "exclude": []}
    for key, value in flatten_args(_table(data, "matrix", src)).items():
        if key in entries:
            if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
                raise InputError(f"{src}: matrix.{key}: expected a list of tables, e.g. [[matrix.{key}]]")
            for i, entry in enumerate(value):
                if not entry:
                    raise InputError(f"{src}: matrix.{key}[{i}]: empty entry")
                entries[key].append({k: _values(f"{src}: matrix.{key}[{i}].{k}", k, v)
                                     for k, v in flatten_args(entry).items()})
            continue
        matrix[key] = _values(f"{src}: matrix.{key}", key, value)

    suite = Suite(name=name, description=description, source=src, defaults=defaults, matrix=matrix,
                  include=tuple(entries["include"]), exclude=tuple(entries["exclude"]), max_jobs=max_jobs)
    suite.expand()
    return suite


def _table(data: dict[str, Any], key: str, src: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise InputError(f"{src}: {key}: expected a table [{key}]")
    return value


def _known(where: str, key: str) -> None:
    if key not in known_keys() and not ARG_RE.match(key):
        raise InputError(f"{where}: {choices_message('key', key, known_keys())}")


def checked_settings(where: str, settings: dict[str, Any]) -> dict[str, Any]:
    """One config's settings (suite keys and workload parameters) validated as a suite's
    would be; raises InputError naming ``where``, the key and the allowed values."""
    out = {}
    for key, value in settings.items():
        _known(where, key)
        out[key] = _validated(f"{where}: {key}", key, value)
    return out


def _flat_list(value: Any) -> bool:
    return isinstance(value, list) and not any(isinstance(v, (list, dict)) for v in value)


def _values(where: str, key: str, value: Any) -> list[Any]:
    _known(where, key)
    if key == "input_shape" and _flat_list(value):  # one shape; a list of shapes sweeps
        value = [value]
    values = value if isinstance(value, list) else [value]
    if not values:
        raise InputError(f"{where}: empty list")
    return [_validated(where, key, v) for v in values]
