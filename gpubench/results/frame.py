"""Results into pandas: one flat row per result, and one row per config over its repeats."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from gpubench.measure.stats import median_ci
from gpubench.results.schema import dig, peak_memory, trained_batch
from gpubench.config import Config

CONFIG_COLUMNS = ["workload", "framework", "device", "batch_size", "precision", "parallelism", "optimizer", "lr",
                  "loss", "compile", "memory_format", "data", "data_workers", "dataset", "checkpointing"]
# metrics.breakdown (gpubench profile) -> breakdown_<field> columns
BREAKDOWN_FIELDS = ["data_ms", "forward_ms", "backward_ms", "optimizer_ms", "idle_ms", "overlap_ms", "step_ms"]
BREAKDOWN_COLUMNS = [f"breakdown_{f}" for f in BREAKDOWN_FIELDS]
# metrics.checkpointing (activation checkpointing against the same config without it)
CHECKPOINTING_FIELDS = ("baseline_config_id", "peak_source", "baseline_peak_bytes", "peak_bytes", "memory_saving",
                        "slowdown")


def device_model(result: dict[str, Any]) -> str | None:
    """The model name of the device a result ran on, from its environment fingerprint."""
    config = result.get("config", {})
    probe = dig(result, "env", "frameworks", config.get("framework", ""))
    if not isinstance(probe, dict):
        return None
    device = config.get("device", "")
    for d in probe.get("devices", []):
        if d.get("name") == device or (":" not in device and d.get("name", "").split(":")[0] == device):
            return d.get("model")
    return None


def flatten(result: dict[str, Any], run: str | None = None) -> dict[str, Any]:
    config = result.get("config", {})
    m = result.get("metrics") or {}
    try:
        typed = Config.from_dict(config)
        labels = {"workload_label": typed.workload_label, "variant": typed.variant,
                  "variant_nodata": replace(typed, data="device", data_workers=Config.data_workers).variant,
                  # the variant without the axis a speed-up compares (report tables)
                  "variant_nocompile": replace(typed, compile=Config.compile).variant,
                  "variant_nomemory_format": replace(typed, memory_format=Config.memory_format).variant}
    except TypeError:  # a config this gpubench cannot build (e.g. from a plugin not loaded now)
        labels = {"workload_label": config.get("workload"), "variant": "", "variant_nodata": "",
                  "variant_nocompile": "", "variant_nomemory_format": ""}
    row: dict[str, Any] = {
        "run": run or result.get("run_id"),
        "config_id": result.get("config_id"),
        "config_hash": result.get("config_hash"),
        "repeat": result.get("repeat", 0),
        **{c: config.get(c) for c in CONFIG_COLUMNS},
        **{f"param_{k}": v for k, v in (config.get("workload_params") or {}).items()},
        **labels,
        "device_model": device_model(result),
        "status": result.get("status"),
        "reason": result.get("reason") or "",
        "throughput": dig(m, "throughput", "median"),
        "throughput_ci_low": dig(m, "throughput", "ci_low"),
        "throughput_ci_high": dig(m, "throughput", "ci_high"),
        "throughput_mean": dig(m, "throughput", "mean"),
        "throughput_wall": m.get("throughput_wall"),
        "step_ms": dig(m, "step_time_ms", "median"),
        "step_ms_p5": dig(m, "step_time_ms", "p5"),
        "step_ms_p95": dig(m, "step_time_ms", "p95"),
        "step_ms_iqr": dig(m, "step_time_ms", "iqr"),
        "step_cv": dig(m, "step_time_ms", "cv"),
        "n_steps": dig(m, "step_time_ms", "n"),
        "noisy": m.get("noisy"),
        "cold_start_ms": m.get("cold_start_ms"),
        "setup_ms": m.get("setup_ms"),
        "loss_first": dig(m, "loss", "first"),
        "loss_last": dig(m, "loss", "last"),
        "loss_fell": dig(m, "loss", "fell"),
        "peak_rss_bytes": dig(m, "memory", "peak_rss_bytes"),
        "peak_allocated_bytes": dig(m, "memory", "peak_allocated_bytes"),
        "peak_reserved_bytes": dig(m, "memory", "peak_reserved_bytes"),
        "data_bytes": dig(m, "memory", "data_bytes"),
        "pipeline_slowdown": dig(m, "pipeline_vs_device", "slowdown"),
        "achieved_tflops": m.get("achieved_tflops"),
        "peak_tflops": m.get("peak_tflops"),
        "mfu": m.get("mfu"),
        "max_batch": dig(m, "batch_search", "max_batch"),
        "train_peak_rss_bytes": dig(m, "memory", "train_peak_rss_bytes"),
        **{f"checkpointing_{k}": dig(m, "checkpointing", k) for k in CHECKPOINTING_FIELDS},
        "energy_per_sample_j": dig(result, "telemetry", "gpu", "energy_per_sample_j"),
        "params": dig(result, "model", "params"),
        "flops_per_sample": dig(result, "model", "flops_per_sample"),
        "step_timing": dig(result, "runtime", "step_timing"),
        **{f"breakdown_{f}": dig(m, "breakdown", f) for f in BREAKDOWN_FIELDS},
        "breakdown_timing": dig(m, "breakdown", "timing"),
        "duration_s": result.get("duration_s"),
        "started_at": result.get("started_at"),
    }
    # the batch the config trained at (a "max" config's is the one its search found; for
    # pipeline:N the batch of a step, not its micro-batches), so strategies line up in charts
    row["batch_trained"] = trained_batch(result)
    row["peak_memory_bytes"], row["peak_memory_source"] = peak_memory(result)
    return row


def results_frame(results: list[dict[str, Any]], run: str | None = None) -> pd.DataFrame:
    """One row per result (per config per repeat)."""
    return pd.DataFrame([flatten(r, run) for r in results])


_FIRST = ["config_hash", *CONFIG_COLUMNS, "workload_label", "variant", "variant_nodata", "variant_nocompile",
          "variant_nomemory_format", "device_model", "params", "flops_per_sample",
          "step_timing", "breakdown_timing", "batch_trained", "max_batch", "checkpointing_baseline_config_id",
          "checkpointing_peak_source", "peak_memory_source"]
_MEDIAN = ["throughput_mean", "throughput_wall", "step_ms", "step_ms_p5", "step_ms_p95", "step_ms_iqr", "step_cv",
           "cold_start_ms", "setup_ms", "loss_first", "loss_last", "peak_rss_bytes", "peak_allocated_bytes",
           "peak_reserved_bytes", "peak_memory_bytes", "data_bytes", "pipeline_slowdown", "energy_per_sample_j",
           *BREAKDOWN_COLUMNS, "achieved_tflops", "peak_tflops", "mfu",
           "train_peak_rss_bytes", "checkpointing_baseline_peak_bytes", "checkpointing_peak_bytes",
           "checkpointing_memory_saving", "checkpointing_slowdown"]


def _aggregate_group(g: pd.DataFrame) -> dict[str, Any]:
    ok = g[g["status"] == "ok"]
    row: dict[str, Any] = {c: g[c].iloc[0] for c in _FIRST if c in g}
    row.update({c: g[c].iloc[0] for c in g.columns if c.startswith("param_")})
    row["repeats"] = len(g)
    row["repeats_ok"] = len(ok)
    if len(ok) == len(g):
        row["status"], row["reason"] = "ok", ""
    else:
        bad = g[g["status"] != "ok"]
        row["status"] = bad["status"].iloc[0]
        reason = bad["reason"].iloc[0]
        row["reason"] = reason if len(g) == 1 else f"{len(ok)} of {len(g)} repeats ok; {reason}"
    if len(ok):
        rates = ok["throughput"].astype(float).to_numpy()
        row["throughput"] = float(np.median(rates))
        if len(ok) == 1:
            row["throughput_ci_low"] = float(ok["throughput_ci_low"].iloc[0])
            row["throughput_ci_high"] = float(ok["throughput_ci_high"].iloc[0])
            row["ci_kind"] = "within-process"
        else:
            row["throughput_ci_low"], row["throughput_ci_high"] = median_ci(rates)
            row["ci_kind"] = "between-repeats"
        for c in _MEDIAN:
            if c in ok:
                vals = pd.to_numeric(ok[c], errors="coerce").dropna()
                row[c] = float(vals.median()) if len(vals) else None
        row["noisy"] = bool(ok["noisy"].fillna(False).astype(bool).any())
        row["loss_fell"] = bool(ok["loss_fell"].fillna(False).astype(bool).all())
    return row


def aggregate(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, config): the median over ok repeats; the CI of a single repeat is
    within-process, over several repeats distribution-free between repeats."""
    if frame.empty:
        return frame
    rows = []
    for (run, config_id), g in frame.groupby(["run", "config_id"], sort=False):
        rows.append({"run": run, "config_id": config_id, **_aggregate_group(g)})
    return pd.DataFrame(rows)
