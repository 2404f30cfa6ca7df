"""Report tables: pandas DataFrames of formatted strings (units and CIs in the cells).

All tables are built from the per-config frame (one row per run and config, repeats
aggregated); the numbers come straight from the results, only formatted here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from gpubench.report import fmt
from gpubench.suite import MAX_BATCH

# what makes two configs "the same config" apart from the axis being compared
IDENTITY = ["run", "workload_label", "framework", "device", "batch_size", "precision", "parallelism", "variant"]


@dataclass(frozen=True)
class Comparison:
    title: str
    axis: str
    baseline: str  # the value of `axis` in the denominator
    note: str
    short: str  # for chart titles


COMPARISONS = (
    Comparison("GPU over CPU", "device", "cpu", "throughput on the GPU / on the CPU, same config",
               "above 1: the GPU is faster"),
    Comparison("Precision over fp32", "precision", "fp32", "throughput at this precision / at fp32, same config",
               "above 1: faster than fp32"),
    Comparison("PyTorch over TensorFlow", "framework", "tensorflow",
               "PyTorch throughput / TensorFlow throughput, same config (above 1: PyTorch faster)",
               "above 1: PyTorch is faster"),
    Comparison("Parallel strategy over single", "parallelism", "single",
               "throughput with this strategy / the single-device config at the same per-device batch "
               "(grad-accum:N: one optimizer update per N micro-batches)", "above 1: faster than single"),
    Comparison("Input pipeline over device-resident data", "data", "device",
               "throughput through the framework's input pipeline / with batches already on the device",
               "below 1: the pipeline costs throughput"),
    Comparison("Compile setting over none", "compile", "none",
               "throughput with this compile setting / with compile = none, same config (PyTorch's none is eager; "
               "TensorFlow's is already a tf.function graph)", "above 1: faster than none"),
    Comparison("Channels-last over contiguous", "memory_format", "contiguous",
               "throughput with channels-last (NHWC) convolutions / contiguous (NCHW), same config",
               "above 1: channels-last is faster"),
)
# axes that are part of ``variant``: a comparison along one matches configs on the variant without it
_VARIANT_AXES = {"data": "variant_nodata", "compile": "variant_nocompile", "memory_format": "variant_nomemory_format"}


def batch_order(batch: object) -> tuple[int, int]:
    """Sort key of batch sizes: numbers ascending, then ``"max"``."""
    return (1, 0) if batch == MAX_BATCH else (0, int(batch))


def _trained(r: pd.Series) -> str:
    """`` (bs 4096)`` after the cell of a ``"max"`` config: the batch its search found."""
    b = r.get("batch_trained")
    return f" (bs {int(b)})" if r["batch_size"] == MAX_BATCH and b is not None and not pd.isna(b) else ""


def _pivot(configs: pd.DataFrame, cell, multi_run: bool) -> dict[str, pd.DataFrame]:
    """Per workload: rows framework x device x precision (x parallelism, x variant, where the
    workload has more than one), columns batch size."""
    out: dict[str, pd.DataFrame] = {}
    for workload, g in configs.groupby("workload_label", sort=False):
        batches = sorted(g["batch_size"].unique(), key=batch_order)
        index_names = (["run"] if multi_run else []) + ["framework", "device", "precision"]
        if "parallelism" in g and (g["parallelism"] != "single").any():
            index_names.append("parallelism")
        if g["variant"].astype(bool).any():
            index_names.append("variant")
        rows: dict[tuple[str, ...], dict[str, str]] = {}
        for _, r in g.iterrows():
            key = tuple(str(r[name]) for name in index_names)
            rows.setdefault(key, {})[f"batch {r['batch_size']}"] = cell(r)
        out[workload] = pd.DataFrame([{**dict(zip(index_names, key)),
                                       **{f"batch {b}": cells.get(f"batch {b}", "") for b in batches}}
                                      for key, cells in rows.items()])
    return out


def _throughput_cell(r: pd.Series) -> str:
    if r["status"] != "ok":
        return r["status"]
    text = fmt.rate_ci(r["throughput"], r["throughput_ci_low"], r["throughput_ci_high"])
    return text + (" *" if r.get("noisy") else "") + _trained(r)


def throughput_tables(configs: pd.DataFrame, multi_run: bool = False) -> dict[str, pd.DataFrame]:
    """Samples/s (global) with its 95% CI, per workload; ``*`` marks a noisy measurement."""
    return _pivot(configs, _throughput_cell, multi_run)


def flops_tables(configs: pd.DataFrame, multi_run: bool = False) -> dict[str, pd.DataFrame]:
    """Model TFLOP/s achieved, and MFU against the measured peak where there is one."""
    if "achieved_tflops" not in configs or configs["achieved_tflops"].isna().all():
        return {}

    def cell(r: pd.Series) -> str:
        mfu = r.get("mfu")
        return (fmt.tflops(r["achieved_tflops"]) + ("" if mfu is None or pd.isna(mfu) else f", MFU {fmt.pct(mfu)}")
                + _trained(r))
    return _pivot(configs[configs["achieved_tflops"].notna()], cell, multi_run)


def memory_tables(configs: pd.DataFrame, multi_run: bool = False) -> dict[str, pd.DataFrame]:
    """Peak memory: the device allocator's peak on a GPU, the worker's peak RSS on CPU."""
    def cell(r: pd.Series) -> str:
        if r["status"] not in ("ok", "diverged"):
            return r["status"]
        return fmt.nbytes(r.get("peak_memory_bytes")) + _trained(r)
    ok = configs[configs["peak_memory_bytes"].notna()] if "peak_memory_bytes" in configs else configs.iloc[0:0]
    return _pivot(ok, cell, multi_run)


PEAK_SOURCES = {"device_allocator_peak": "device allocator peak",
                "process_peak_rss_during_training": "process peak RSS while training",
                "process_peak_rss": "process peak RSS"}


def checkpointing_table(configs: pd.DataFrame, multi_run: bool = False) -> pd.DataFrame:
    """Activation checkpointing against the same config without it (``metrics.checkpointing``,
    recorded when that config ran earlier in the run): peak memory, the saving, the slowdown."""
    if "checkpointing_memory_saving" not in configs:
        return pd.DataFrame()
    rows = configs[configs["checkpointing_memory_saving"].notna()]
    return pd.DataFrame({
        **({"run": rows["run"]} if multi_run else {}),
        "config": rows["config_id"],
        "without checkpointing": rows["checkpointing_baseline_config_id"],
        "peak memory": rows["checkpointing_peak_source"].map(lambda v: PEAK_SOURCES.get(v, v)),
        "peak": rows["checkpointing_peak_bytes"].map(fmt.nbytes),
        "peak without": rows["checkpointing_baseline_peak_bytes"].map(fmt.nbytes),
        "memory saving": rows["checkpointing_memory_saving"].map(fmt.pct),
        "slowdown": rows["checkpointing_slowdown"].map(fmt.ratio),
    }).reset_index(drop=True)


def energy_tables(configs: pd.DataFrame, multi_run: bool = False) -> dict[str, pd.DataFrame]:
    """Energy per sample, where GPU telemetry measured it."""
    if "energy_per_sample_j" not in configs or configs["energy_per_sample_j"].isna().all():
        return {}
    has = configs[configs["energy_per_sample_j"].notna()]
    return _pivot(has, lambda r: fmt.joules(r["energy_per_sample_j"]), multi_run)


def speedup_frame(configs: pd.DataFrame, comparison: Comparison) -> pd.DataFrame:
    """Numeric speed-ups: one row per (target config, its baseline config)."""
    ok = configs[configs["status"] == "ok"]
    key = [c for c in IDENTITY if c != comparison.axis and c in ok]
    base = ok[ok[comparison.axis] == comparison.baseline]
    if comparison.axis == "device":  # any GPU against the CPU
        targets = ok[ok["device"].str.startswith("cuda", na=False)]
    elif comparison.axis == "framework":
        targets = ok[ok["framework"] == "torch"]
    else:
        targets = ok[ok[comparison.axis] != comparison.baseline]
    if comparison.axis in _VARIANT_AXES:  # match on the variant without this axis
        key = [c if c != "variant" else _VARIANT_AXES[comparison.axis] for c in key]
    merged = targets.merge(base, on=key, suffixes=("", "_base"))
    if merged.empty:
        return pd.DataFrame(columns=["run", "workload_label", "config_id", "baseline_id", "speedup"])
    merged["speedup"] = merged["throughput"] / merged["throughput_base"]
    merged = merged.rename(columns={"config_id_base": "baseline_id"})
    return merged[["run", "workload_label", "config_id", "baseline_id", "speedup"]].reset_index(drop=True)


def speedup_table(configs: pd.DataFrame, comparison: Comparison, multi_run: bool = False) -> pd.DataFrame:
    frame = speedup_frame(configs, comparison)
    cols = (["run"] if multi_run else []) + ["config_id", "baseline_id", "speedup"]
    out = frame[cols].copy()
    out["speedup"] = out["speedup"].map(fmt.ratio)
    return out.rename(columns={"config_id": "config", "baseline_id": "baseline"})


def run_comparison(configs: pd.DataFrame, run_ids: list[str]) -> pd.DataFrame:
    """Several runs side by side: throughput of every config in each run, and each later run
    over the first."""
    first = run_ids[0]
    table = configs.pivot_table(index="config_id", columns="run", values="throughput", aggfunc="first")
    out = pd.DataFrame({"config": table.index})
    for run in run_ids:
        values = table[run] if run in table else pd.Series(index=table.index, dtype=float)
        out[run] = values.map(fmt.rate).to_numpy()
    for run in run_ids[1:]:
        if run in table and first in table:
            out[f"{run} / {first}"] = (table[run] / table[first]).map(fmt.ratio).to_numpy()
    return out


def failures(configs: pd.DataFrame, multi_run: bool = False) -> pd.DataFrame:
    bad = configs[configs["status"] != "ok"]
    cols = (["run"] if multi_run else []) + ["config_id", "status", "reason"]
    return bad[cols].rename(columns={"config_id": "config"}).reset_index(drop=True)


def noisy(configs: pd.DataFrame, multi_run: bool = False) -> pd.DataFrame:
    flagged = configs[(configs["status"] == "ok") & configs["noisy"].fillna(False).astype(bool)]
    out = flagged[(["run"] if multi_run else []) + ["config_id", "step_cv"]].copy()
    out["step_cv"] = out["step_cv"].map(fmt.pct)
    return out.rename(columns={"config_id": "config", "step_cv": "cv of step times"}).reset_index(drop=True)


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table (no tabulate dependency)."""
    if df.empty:
        return "_none_\n"
    def esc(v: object) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    header = "| " + " | ".join(esc(c) for c in df.columns) + " |"
    sep = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(esc(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, sep, *body]) + "\n"
