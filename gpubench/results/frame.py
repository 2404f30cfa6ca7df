"""Results into pandas: one flat row per result, and one row per config over its repeats.

A row holds the config's identity (its settings and labels) and every metric of the registry
(gpubench.results.metrics), under the metric's name; how repeats combine is the metric's own
rule, so a new metric needs no change here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from gpubench.config import COLUMNS, Config
from gpubench.measure.stats import median_ci
from gpubench.results.metrics import METRICS, median_to_target
from gpubench.results.result import Result
from gpubench.results.schema import MEASURED_STATUSES
from gpubench.results.twins import VARIANT_AXES

# the settings declared as columns (gpubench.config.setting(column=True), and the identity axes)
CONFIG_COLUMNS = list(COLUMNS)
LABEL_COLUMNS = ["workload_label", "variant", *(f"variant_no_{axis}" for axis in VARIANT_AXES)]
# identity columns first, in this order (results.csv), then the parameters, then the metrics
IDENTITY_COLUMNS = ["run", "config_id", "config_hash", *CONFIG_COLUMNS, *LABEL_COLUMNS, "device_model"]


def device_model(result: Result) -> str | None:
    """The model name of the device a result ran on, from its environment fingerprint."""
    probe = result.get("env", "frameworks", result.framework)
    if not isinstance(probe, dict):
        return None
    device = str(result.config.get("device", ""))
    for d in probe.get("devices") or []:
        name = d.get("name") or ""
        if name == device or (":" not in device and name.split(":")[0] == device):
            model: str | None = d.get("model")
            return model
    return None


def _labels(config: dict[str, Any]) -> dict[str, Any]:
    """The workload label, the variant, and the variant without each twin axis (to match a
    config with its twin along that axis)."""
    try:
        typed = Config.from_dict(config)
    except TypeError:  # a config this gpubench cannot build (e.g. from a plugin not loaded now)
        return {"workload_label": config.get("workload"), "variant": "",
                **{f"variant_no_{axis}": "" for axis in VARIANT_AXES}}
    return {"workload_label": typed.workload_label, "variant": typed.variant,
            **{f"variant_no_{axis}": replace(typed, **{axis: getattr(Config, axis)}).variant for axis in VARIANT_AXES}}


def flatten(result: Result, run: str | None = None) -> dict[str, Any]:
    config = result.config
    return {
        "run": run or result.run_id,
        "config_id": result.config_id,
        "config_hash": result.config_hash,
        "repeat": result.repeat,
        **{c: config.get(c) for c in CONFIG_COLUMNS},
        **{f"param_{k}": v for k, v in (config.get("workload_params") or {}).items()},
        **_labels(config),
        "device_model": device_model(result),
        "status": result.status,
        "reason": result.reason,
        "started_at": result.started_at,
        **{m.name: m.value(result) for m in METRICS},
    }


def results_frame(results: list[Result], run: str | None = None) -> pd.DataFrame:
    """One row per result (per config per repeat)."""
    return pd.DataFrame([flatten(r, run) for r in results])


def _first(*columns: pd.Series) -> Any:
    """The first value that is not missing, looking through each column in turn."""
    for col in columns:
        present = col.dropna()
        if len(present):
            return present.iloc[0]
    return None


def _to_target(values: pd.Series, reached: pd.Series) -> float | None:
    """The median over the repeats that trained to a target (``median_to_target``)."""
    tried = reached.dropna().astype(bool)
    times = pd.to_numeric(values[tried.index[tried]], errors="coerce").dropna().tolist()
    return median_to_target(times, int((~tried).sum()))


def _aggregate_group(g: pd.DataFrame) -> dict[str, Any]:
    ok = g[g["status"].isin(MEASURED_STATUSES)]
    row: dict[str, Any] = {c: g[c].iloc[0] for c in IDENTITY_COLUMNS if c in g and c not in ("run", "config_id")}
    row.update({c: g[c].iloc[0] for c in g.columns if c.startswith("param_")})
    row["repeats"] = len(g)
    row["repeats_ok"] = int((g["status"] == "ok").sum())
    if row["repeats_ok"] == len(g):
        row["status"], row["reason"] = "ok", ""
    else:
        bad = g[g["status"] != "ok"]
        row["status"] = bad["status"].iloc[0]
        reason = bad["reason"].iloc[0]
        row["reason"] = reason if len(g) == 1 else f"{row['repeats_ok']} of {len(g)} repeats ok; {reason}"
    for m in METRICS:
        if m.name not in g:
            continue
        if m.combine == "to_target":
            row[m.name] = _to_target(g[m.name], g["target_reached"])
        elif m.combine == "reached":
            row[m.name] = int(g[m.name].dropna().astype(bool).sum()) if g[m.name].notna().any() else None
        elif m.combine == "first":
            row[m.name] = _first(ok[m.name], g[m.name])
        elif not len(ok):  # nothing measured: the column is still there (readers index it), empty
            row[m.name] = None
        elif m.combine == "median":
            values = pd.to_numeric(ok[m.name], errors="coerce").dropna()
            row[m.name] = float(values.median()) if len(values) else None
        else:  # a flag: all / any of the measured repeats
            flags = ok[m.name].fillna(False).astype(bool)
            row[m.name] = bool(flags.all() if m.combine == "all" else flags.any())
    if len(ok):
        # one repeat: its own within-process CI; several: a distribution-free CI of the
        # median between repeats (each a fresh process)
        rates = ok["throughput"].astype(float).to_numpy()
        row["throughput"] = float(np.median(rates))
        if len(ok) == 1:
            row["ci_kind"] = "within-process"
        else:
            row["throughput_ci_low"], row["throughput_ci_high"] = median_ci(rates)
            row["ci_kind"] = "between-repeats"
    return row


def aggregate(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, config): each metric combined over the measured repeats (ok, or a
    missed target) by its own rule; the
    CI of a single repeat is within-process, over several repeats distribution-free between
    repeats."""
    if frame.empty:
        return frame
    groups = frame.groupby(["run", "config_id"], sort=False)
    return pd.DataFrame([{"run": run, "config_id": config_id, **_aggregate_group(g)} for (run, config_id), g in groups])
