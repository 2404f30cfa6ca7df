"""A result: one config repeat's outcome, as a typed value, written and read here only.

``Outcome`` is what a worker (or the runner, deciding a config without one) found: a status,
its reason and whatever was measured. ``Result`` is one line of a run's results.jsonl: the
outcome of one config repeat with its identity, environment and timing. Both are plain
values that a test can build by hand; ``to_json``/``from_json`` are the only translation to
and from the file format (docs/results-schema.md), and ``from_json`` checks a line's shape
(``schema.result_problem``) so that readers can use the fields without guarding each one.

The nested blocks (``metrics``, ``telemetry``, ``model``, ``runtime``, ``profile``) stay JSON
objects: their figures are read through the metric registry (gpubench.results.metrics), which
names where each one lives.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from gpubench.results.schema import SCHEMA_VERSION, STATUSES, declare_field, dig, result_problem


class ResultError(ValueError):
    """A JSON object that is not a result line (the message says what is wrong)."""


@dataclass(kw_only=True)
class Outcome:
    """What became of one config repeat: ``status`` (one of ``schema.STATUSES``), ``reason``
    (``""`` for ok) and whatever was measured. Optional blocks are None when absent."""

    status: str
    reason: str = ""
    metrics: dict[str, Any] | None = None
    telemetry: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    runtime: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None
    phases: list[dict[str, Any]] | None = None
    log: str | None = None  # the worker's log, relative to the run directory
    traceback: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; expected one of: {', '.join(STATUSES)}")

    def get(self, *path: str) -> Any:
        """The value at ``path`` (a block, then keys inside it), or None where absent:
        ``r.get("metrics", "throughput", "median")``."""
        return dig(getattr(self, path[0], None), *path[1:]) if path and path[0] in _BLOCKS else None

    def with_metrics(self, **figures: Any) -> None:
        """Add figures to ``metrics`` (creating it)."""
        self.metrics = {**(self.metrics or {}), **figures}

    def outcome_json(self) -> dict[str, Any]:
        """The outcome's keys as they appear in a result line (absent blocks left out)."""
        out: dict[str, Any] = {"status": self.status, "reason": self.reason, "metrics": self.metrics}
        return out | {name: v for name in _OPTIONAL_OUTCOME if (v := getattr(self, name)) is not None}

    @staticmethod
    def from_outcome_json(d: dict[str, Any]) -> Outcome:
        """The worker's handover file (result.json) back into an Outcome."""
        return Outcome(status=str(d.get("status")), reason=d.get("reason") or "", metrics=d.get("metrics"),
                       **{k: d.get(k) for k in _OPTIONAL_OUTCOME})


_OPTIONAL_OUTCOME = ("telemetry", "model", "runtime", "profile", "phases", "log", "traceback")
_BLOCKS = ("metrics", "telemetry", "model", "runtime", "profile", "config", "env")


@dataclass(kw_only=True)
class Result(Outcome):
    """One line of results.jsonl."""

    run_id: str
    config_id: str
    repeat: int
    config: dict[str, Any]  # every setting, as stored (Config.to_dict)
    config_hash: str | None = None
    env: dict[str, Any] | None = None
    started_at: str | None = None
    duration_s: float | None = None
    node_rank: int | None = None  # node r > 0 of a multi-node run: its own outcome (node.jsonl)
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)  # keys this gpubench does not know, kept as read

    @staticmethod
    def of(outcome: Outcome, **identity: Any) -> Result:
        """A result line from an outcome and the job's identity (run_id, config_id, ...)."""
        return Result(**{f.name: getattr(outcome, f.name) for f in fields(Outcome)}, **identity)

    @property
    def framework(self) -> str:
        framework: str = self.config["framework"]
        return framework

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def trained_batch(self) -> int | None:
        """The ``batch_size`` this result trained at: its config's, or for ``batch_size = "max"``
        the batch its search found (None when none fitted). Per device and, for gradient
        accumulation, per micro-batch; for ``pipeline:N``, the batch every stage processes."""
        found = self.get("metrics", "batch_search", "max_batch")
        if found is not None:
            return int(found)
        batch = self.config.get("batch_size")
        return batch if isinstance(batch, int) else None

    def peak_memory(self) -> tuple[int | None, str | None]:
        """(bytes, what they are) of the peak memory this result's training needed, the one
        figure the summary table, the report, the gate and the checkpointing comparison use:
        the device allocator's peak on a GPU (``device_allocator_peak``); on the CPU the
        worker's peak RSS while training (``process_peak_rss_during_training``: framework,
        model, optimizer state, data and activations; setup's transients excluded), or, where
        that was not measured (not Linux), over its whole life (``process_peak_rss``)."""
        for key, source in (("peak_allocated_bytes", "device_allocator_peak"),
                            ("train_peak_rss_bytes", "process_peak_rss_during_training"),
                            ("peak_rss_bytes", "process_peak_rss")):
            value = self.get("metrics", "memory", key)
            if value is not None:
                return value, source
        return None, None

    def to_json(self) -> dict[str, Any]:
        """The result line's JSON object (keys in the documented order; absent blocks left out)."""
        out: dict[str, Any] = {"schema_version": self.schema_version, "run_id": self.run_id,
                               "config_id": self.config_id, "config_hash": self.config_hash,
                               "repeat": self.repeat, "config": self.config, **self.outcome_json()}
        if self.config_hash is None:
            del out["config_hash"]
        out |= {name: v for name in ("env", "started_at", "duration_s", "node_rank")
                if (v := getattr(self, name)) is not None}
        return {**out, **self.extra}

    @staticmethod
    def from_json(d: Any) -> Result:
        """A result line's JSON object as a Result; ResultError saying what is wrong with its
        shape (required keys and types, the statuses, the figures readers compute with)."""
        if not isinstance(d, dict):
            raise ResultError("not a JSON object")
        if problem := result_problem(d):
            raise ResultError(problem)
        known = {f.name for f in fields(Result)} - {"extra"}
        values = {k: d[k] for k in known if k in d}
        values["reason"] = values.get("reason") or ""
        return Result(**values, extra={k: v for k, v in d.items() if k not in known})


def _declare_fields() -> None:
    """Each optional field of a result line typed by its annotation (``config_hash: str | None``
    is text where present), for the check every loaded line passes (schema.result_problem)."""
    kinds = {"str": "text", "float": "number", "int": "number", "dict": "object", "list": "list"}
    for f in fields(Result):
        base = str(f.type).split("|")[0].split("[")[0].strip()
        if f.name != "extra" and "None" in str(f.type) and base in kinds:
            declare_field(f.name, kinds[base])


_declare_fields()
