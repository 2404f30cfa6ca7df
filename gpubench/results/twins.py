"""Comparisons between twin configs: configs of a run that differ in one setting only.

Pure functions over the per-config frame (``frame.aggregate``: one row per run and config,
repeats combined), computed in one place for the report's tables and charts and for
summary.md. They never depend on the order in which the sweep ran its configs.

- ``speedups``: throughput of each config over its twin with the baseline value of one axis
  (GPU over CPU, each precision over fp32, each framework over the reference one, PyTorch:
  ``backends.REFERENCE_FRAMEWORK``; a parallel strategy over
  single, the input pipeline over device-resident data, a compile setting over none,
  channels-last over contiguous). For parallel strategies also ``scaling_efficiency``: the
  speed-up over (devices x single), where both trained at the same per-device batch.
- ``checkpointing``: activation checkpointing against the same config without it, at the
  same batch: both peaks, the memory saving and the slowdown.
- ``sharding``: ``fsdp:N`` against ``ddp:N`` (the same config, N and batch): the training state
  and peak memory of a device on both sides, the saving, and the throughput ratio.
- ``by_devices``: each config's strategy and N, for a chart of per-device figures against N.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from gpubench import fmt
from gpubench.backends import REFERENCE_FRAMEWORK, display_name, uncompiled_note
from gpubench.options import parse_parallelism

# what makes two configs "the same config" apart from the axis being compared
IDENTITY = ["run", "workload_label", "framework", "device", "batch_size", "precision", "parallelism", "variant"]
# axes that are part of ``variant`` (frame.VARIANT_AXES): a comparison along one matches
# configs on the variant without that axis
VARIANT_AXES = ("data", "compile", "memory_format", "checkpointing")


@dataclass(frozen=True)
class Twins:
    title: str
    axis: str
    baseline: str  # the value of ``axis`` in the denominator
    note: str
    short: str  # for chart titles


COMPARISONS = (
    Twins("GPU over CPU", "device", "cpu", "throughput on the GPU / on the CPU, same config",
          "above 1: the GPU is faster"),
    Twins("Precision over fp32", "precision", "fp32", "throughput at this precision / at fp32, same config",
          "above 1: faster than fp32"),
    Twins(f"Framework over {display_name(REFERENCE_FRAMEWORK)}", "framework", REFERENCE_FRAMEWORK,
          f"each framework's throughput / {display_name(REFERENCE_FRAMEWORK)}'s, same config (above 1: that "
          f"framework is faster). The same compile setting is not the same execution: with compile = none, "
          f"{uncompiled_note()}; compare compiled settings for like with like",
          f"above 1: faster than {display_name(REFERENCE_FRAMEWORK)}"),
    Twins("Parallel strategy over single", "parallelism", "single",
          "throughput with this strategy / the single-device config at the same per-device batch "
          "(grad-accum:N: one optimizer update per N micro-batches); scaling efficiency = that / devices",
          "above 1: faster than single"),
    Twins("Input pipeline over device-resident data", "data", "device",
          "throughput through the framework's input pipeline / with batches already on the device",
          "below 1: the pipeline costs throughput"),
    Twins("Compile setting over none", "compile", "none",
          f"throughput with this compile setting / with compile = none, same config ({uncompiled_note()})",
          "above 1: faster than none"),
    Twins("Channels-last over contiguous", "memory_format", "contiguous",
          "throughput with channels-last (NHWC) convolutions / contiguous (NCHW), same config",
          "above 1: channels-last is faster"),
)
SPEEDUP_COLUMNS = ["run", "workload_label", "config_id", "baseline_id", "speedup", "speedup_low", "speedup_high",
                   "decided", "noisy_pair"]


def _measured(configs: pd.DataFrame) -> pd.DataFrame:
    """The configs with at least one ok repeat (their figures are the medians over those)."""
    return configs[configs["repeats_ok"] > 0] if "repeats_ok" in configs else configs[configs["status"] == "ok"]


def _pairs(configs: pd.DataFrame, axis: str, baseline: str) -> pd.DataFrame:
    """Every measured config whose twin along ``axis`` has the baseline value, merged with that
    twin (its columns suffixed ``_base``)."""
    ok = _measured(configs)
    if ok.empty or axis not in ok:
        return pd.DataFrame()
    key = [c for c in IDENTITY if c != axis and c in ok]
    if axis in VARIANT_AXES:
        key = [f"variant_no_{axis}" if c == "variant" else c for c in key]
    base = ok[ok[axis] == baseline]
    if axis == "device":  # any GPU against the CPU
        targets = ok[ok["device"].astype(str).str.startswith("cuda")]
    else:
        targets = ok[ok[axis] != baseline]
    return targets.merge(base, on=key, suffixes=("", "_base"))


def speedups(configs: pd.DataFrame, comparison: Twins) -> pd.DataFrame:
    """One row per (config, its twin): ``speedup`` = throughput / the twin's, ``speedup_low``
    and ``speedup_high`` the range the two 95% intervals allow, ``noisy_pair`` where a side is
    noisy, ``decided`` where the range excludes 1 and neither is; ``to_target`` where both
    trained to a target, the twin's time to it over this one's (above 1: sooner, whatever the
    rate said: a faster step may need more of them); for the parallelism axis also
    ``devices`` and ``scaling_efficiency`` (None where the two trained at different batches:
    two ``batch_size = "max"`` configs whose searches found different ones)."""
    merged = _pairs(configs, comparison.axis, comparison.baseline)
    if merged.empty:
        return pd.DataFrame(columns=SPEEDUP_COLUMNS)
    merged["speedup"] = merged["throughput"] / merged["throughput_base"]
    # the ratio's range from the two 95% intervals, end over opposite end (a bound, wider than
    # the ratio's own interval): "decided" where it excludes 1 and neither side is noisy
    merged["speedup_low"] = merged["throughput_ci_low"] / merged["throughput_ci_high_base"]
    merged["speedup_high"] = merged["throughput_ci_high"] / merged["throughput_ci_low_base"]
    merged["noisy_pair"] = merged["noisy"].fillna(False).astype(bool) | merged["noisy_base"].fillna(False).astype(bool)
    merged["decided"] = ~merged["noisy_pair"] & ((merged["speedup_low"] > 1) | (merged["speedup_high"] < 1))
    merged = merged.rename(columns={"config_id_base": "baseline_id"})
    columns = list(SPEEDUP_COLUMNS)
    if "time_to_target_s" in merged:  # a target's twins: which reaches it sooner (the baseline's time / this one's)
        merged["to_target"] = (pd.to_numeric(merged["time_to_target_s_base"], errors="coerce")
                               / pd.to_numeric(merged["time_to_target_s"], errors="coerce"))
        columns.append("to_target")
    if comparison.axis == "parallelism":
        same_batch = merged["batch_trained"] == merged["batch_trained_base"]
        merged["scaling_efficiency"] = (merged["speedup"] / merged["devices"]).where(same_batch)
        columns += ["devices", "scaling_efficiency"]
    return merged[columns].reset_index(drop=True)


def speedup_text(row: Any) -> str:
    """``1.42x [1.31, 1.55]`` (a ``speedups`` row), with ``noisy`` or ``undecided`` where the
    figure decides nothing."""
    text = fmt.ratio(row["speedup"])
    if pd.notna(row.get("speedup_low")) and pd.notna(row.get("speedup_high")):
        text += f" [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]"
    if row.get("noisy_pair"):
        return text + " noisy"
    return text if row.get("decided") else text + " undecided"


CHECKPOINTING_COLUMNS = ["run", "config_id", "baseline_id", "peak_source", "peak_bytes", "baseline_peak_bytes",
                         "memory_saving", "slowdown"]


def checkpointing(configs: pd.DataFrame) -> pd.DataFrame:
    """Activation checkpointing against the same config without it, trained at the same
    batch: ``memory_saving`` = 1 - peak / peak without (negative: checkpointing used more),
    ``slowdown`` = throughput without / with. Peaks are the same kind on both sides
    (``peak_memory_source``)."""
    merged = _pairs(configs, "checkpointing", "none")
    if not merged.empty:
        merged = merged[(merged["batch_trained"] == merged["batch_trained_base"])
                        & merged["peak_memory_bytes"].notna() & merged["peak_memory_bytes_base"].notna()
                        & (merged["peak_memory_source"] == merged["peak_memory_source_base"])]
    if merged.empty:
        return pd.DataFrame(columns=CHECKPOINTING_COLUMNS)
    out = pd.DataFrame({
        "run": merged["run"], "config_id": merged["config_id"], "baseline_id": merged["config_id_base"],
        "peak_source": merged["peak_memory_source"], "peak_bytes": merged["peak_memory_bytes"],
        "baseline_peak_bytes": merged["peak_memory_bytes_base"],
        "memory_saving": 1.0 - merged["peak_memory_bytes"] / merged["peak_memory_bytes_base"],
        "slowdown": merged["throughput_base"] / merged["throughput"],
    })
    return out.reset_index(drop=True)


def _strategy(parallelism: object) -> str:
    """``ddp:4`` -> ``ddp``; ``fsdp:2+tp:4`` -> ``fsdp+tp:4``; a value gpubench does not know
    (a line from elsewhere) as it is."""
    try:
        axes = parse_parallelism(parallelism).axes
    except ValueError:
        return str(parallelism)
    return "+".join(k for k, _ in axes) + (f":{axes[-1][1]}" if len(axes) > 1 else "")


def by_devices(configs: pd.DataFrame) -> pd.DataFrame:
    """The measured configs with ``kind`` (``single``, ``ddp``, ``fsdp``...; ``fsdp+tp:B`` for
    ``fsdp:A+tp:B``: a line per B, as A grows) and ``n``, the devices one step ran on (1 for
    single and grad-accum)."""
    ok = _measured(configs)
    if ok.empty or "parallelism" not in ok:
        return ok.assign(kind=pd.Series(dtype=str), n=pd.Series(dtype=int))
    kinds = [_strategy(p) for p in ok["parallelism"]]
    return ok.assign(kind=kinds, n=pd.to_numeric(ok["devices"], errors="coerce").fillna(1).astype(int))


SHARDING_COLUMNS = ["run", "config_id", "baseline_id", "state_bytes", "baseline_state_bytes", "state_saving",
                    "peak_source", "peak_bytes", "baseline_peak_bytes", "peak_saving", "throughput_ratio"]


def sharding(configs: pd.DataFrame) -> pd.DataFrame:
    """``fsdp:N`` against ``ddp:N`` of the same config, N and per-device batch: each device's
    training state (``state_bytes_per_device``) and peak memory on both sides, what sharding
    saves of each (1 - fsdp / ddp), and ``throughput_ratio`` = fsdp's throughput / ddp's (below
    1: what sharding costs in speed). Peaks are compared where they are the same kind."""
    ok = by_devices(configs)
    key = [c for c in IDENTITY if c != "parallelism" and c in ok] + ["n"]
    merged = ok[ok["kind"] == "fsdp"].merge(ok[ok["kind"] == "ddp"], on=key, suffixes=("", "_base"))
    if merged.empty:
        return pd.DataFrame(columns=SHARDING_COLUMNS)
    merged = merged[merged["batch_trained"] == merged["batch_trained_base"]]
    same_peak = merged["peak_memory_source"] == merged["peak_memory_source_base"]
    state = pd.to_numeric(merged["state_bytes_per_device"], errors="coerce")
    state_base = pd.to_numeric(merged["state_bytes_per_device_base"], errors="coerce")
    peak = pd.to_numeric(merged["peak_memory_bytes"], errors="coerce").where(same_peak)
    peak_base = pd.to_numeric(merged["peak_memory_bytes_base"], errors="coerce").where(same_peak)
    return pd.DataFrame({
        "run": merged["run"], "config_id": merged["config_id"], "baseline_id": merged["config_id_base"],
        "state_bytes": state, "baseline_state_bytes": state_base, "state_saving": 1.0 - state / state_base,
        "peak_source": merged["peak_memory_source"], "peak_bytes": peak, "baseline_peak_bytes": peak_base,
        "peak_saving": 1.0 - peak / peak_base, "throughput_ratio": merged["throughput"] / merged["throughput_base"],
    }).reset_index(drop=True)
