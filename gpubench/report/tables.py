"""Report tables: pandas DataFrames of formatted strings (units and CIs in the cells).

All tables are built from the per-config frame (one row per run and config, repeats
aggregated); the numbers come straight from the results, only formatted here.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from gpubench import fmt
from gpubench.calibrate import RECALIBRATE
from gpubench.config import MAX_BATCH
from gpubench.results import twins
from gpubench.results.metrics import BY_NAME
from gpubench.results.schema import MEASURED_STATUSES
from gpubench.telemetry import contention

PEAK_SOURCES = {"device_allocator_peak": "device allocator peak",
                "process_peak_rss_during_training": "process peak RSS while training",
                "process_peak_rss": "process peak RSS"}


def cell(name: str, value: object) -> str:
    """One value of a registry metric, written with its unit."""
    return fmt.metric(BY_NAME[name].kind, value)


def batch_order(batch: object) -> tuple[int, int]:
    """Sort key of batch sizes: numbers ascending, then ``"max"``."""
    return (1, 0) if batch == MAX_BATCH else (0, int(str(batch)))


def _trained(r: pd.Series) -> str:
    """`` (bs 4096)`` after the cell of a ``"max"`` config: the batch its search found."""
    b = r.get("batch_trained")
    return f" (bs {int(b)})" if r["batch_size"] == MAX_BATCH and pd.notna(b) else ""


def having(configs: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows with a value of ``name`` (none where no result has the column)."""
    return configs[configs[name].notna()] if name in configs else configs.iloc[0:0]


def _pivot(configs: pd.DataFrame, make_cell: Callable[[pd.Series], str], multi_run: bool) -> dict[str, pd.DataFrame]:
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
            rows.setdefault(key, {})[f"batch {r['batch_size']}"] = make_cell(r)
        out[workload] = pd.DataFrame([{**dict(zip(index_names, key)),
                                       **{f"batch {b}": cells.get(f"batch {b}", "") for b in batches}}
                                      for key, cells in rows.items()])
    return out


def target_text(r: pd.Series) -> str:
    """A target config's time to it and how many repeats reached it (``12.3 s (3/3 reached)``,
    ``no time (1/3 reached)`` where half or more missed); "" without a target."""
    reached = r.get("target_reached")
    if reached is None or pd.isna(reached):
        return ""
    t = r.get("time_to_target_s")
    return f"{cell('time_to_target_s', t) if pd.notna(t) else 'no time'} ({int(reached)}/{int(r['repeats'])} reached)"


def _throughput_cell(r: pd.Series) -> str:
    if r["status"] not in MEASURED_STATUSES or pd.isna(r.get("throughput")):
        return r["status"]
    text = fmt.rate_ci(r["throughput"], r["throughput_ci_low"], r["throughput_ci_high"])
    tokens = r.get("tokens_per_s")
    to_target = target_text(r)
    return (text + (" *" if r.get("noisy") else "") + (f" ({cell('tokens_per_s', tokens)} tokens/s)"
                                                      if pd.notna(tokens) else "") + _trained(r)
            + (f"; to target {to_target}" if to_target else ""))


def throughput_tables(configs: pd.DataFrame, multi_run: bool = False) -> dict[str, pd.DataFrame]:
    """Samples/s (global) with its 95% CI, per workload; ``*`` marks a noisy measurement; a
    target's time to it beside."""
    return _pivot(configs, _throughput_cell, multi_run)


def above_peak(r: pd.Series) -> bool:
    """Achieved more than the calibrated peak it was compared with (or an older result's stored
    MFU is above 100%): no MFU is shown for it, but the hint to recalibrate."""
    achieved, peak = r.get("achieved_tflops"), r.get("peak_tflops")
    return bool(r.get("above_peak") or (pd.notna(achieved) and pd.notna(peak) and achieved > peak))


def above_peak_note(configs: pd.DataFrame) -> str | None:
    """One sentence for the configs that achieved more than their peak, or None."""
    n = int(sum(above_peak(r) for _, r in configs.iterrows())) if len(configs) else 0
    return (f"{n} config(s) achieved more TFLOP/s than the calibrated peak of their precision, so that peak is "
            f"no ceiling (a stale calibration, or other load while it was measured) and no MFU is shown: "
            f"recalibrate with {RECALIBRATE}" if n else None)


def flops_tables(configs: pd.DataFrame, multi_run: bool = False) -> dict[str, pd.DataFrame]:
    """Model TFLOP/s achieved, MFU against the measured peak where there is one and it is not
    below what was achieved (then the hint to recalibrate instead), and MFU against the
    datasheet's dense peak where the GPU is in the table: each named by its denominator."""
    def flops_cell(r: pd.Series) -> str:
        mfu, sheet = r.get("mfu"), r.get("mfu_datasheet")
        datasheet = f", MFU {cell('mfu', sheet)} of the datasheet peak" if pd.notna(sheet) else ""
        hfu = [f"HFU {cell('hfu', r.get(k))} of the {kind} peak" for k, kind in (("hfu", "measured"),
                                                                                   ("hfu_datasheet", "datasheet"))
               if pd.notna(r.get(k))]
        datasheet += "".join(f", {h}" for h in hfu)  # checkpointing's recomputed forward counted
        if above_peak(r):
            return (f"{cell('achieved_tflops', r['achieved_tflops'])}, above the calibrated peak "
                    f"({cell('peak_tflops', r['peak_tflops'])}): recalibrate with {RECALIBRATE}" + datasheet
                    + _trained(r))
        return (cell("achieved_tflops", r["achieved_tflops"])
                + (f", MFU {cell('mfu', mfu)} of the measured peak" if pd.notna(mfu) else "") + datasheet + _trained(r))
    return _pivot(having(configs, "achieved_tflops"), flops_cell, multi_run)


def memory_tables(configs: pd.DataFrame, multi_run: bool = False) -> dict[str, pd.DataFrame]:
    """Peak memory: the device allocator's peak on a GPU, the worker's peak RSS on CPU."""
    def memory_cell(r: pd.Series) -> str:
        if r["status"] not in ("ok", "diverged"):
            return r["status"]
        return cell("peak_memory_bytes", r.get("peak_memory_bytes")) + _trained(r)
    return _pivot(having(configs, "peak_memory_bytes"), memory_cell, multi_run)


def checkpointing_table(configs: pd.DataFrame, multi_run: bool = False) -> pd.DataFrame:
    """Activation checkpointing against the same config without it (twins.checkpointing):
    peak memory, the saving, the slowdown."""
    rows = twins.checkpointing(configs)
    if rows.empty:
        return pd.DataFrame()
    return pd.DataFrame({
        **({"run": rows["run"]} if multi_run else {}),
        "config": rows["config_id"],
        "without checkpointing": rows["baseline_id"],
        "peak memory": rows["peak_source"].map(lambda v: PEAK_SOURCES.get(v, v)),
        "peak": rows["peak_bytes"].map(fmt.nbytes),
        "peak without": rows["baseline_peak_bytes"].map(fmt.nbytes),
        "memory saving": rows["memory_saving"].map(fmt.pct),
        "slowdown": rows["slowdown"].map(fmt.ratio),
    }).reset_index(drop=True)


def sharding_table(configs: pd.DataFrame, multi_run: bool = False) -> pd.DataFrame:
    """fsdp:N against ddp:N (twins.sharding): each device's training state and peak memory,
    the savings, and the throughput ratio."""
    rows = twins.sharding(configs)
    if rows.empty:
        return pd.DataFrame()
    return pd.DataFrame({
        **({"run": rows["run"]} if multi_run else {}),
        "config": rows["config_id"],
        "ddp twin": rows["baseline_id"],
        "state per device": rows["state_bytes"].map(fmt.nbytes),
        "ddp's": rows["baseline_state_bytes"].map(fmt.nbytes),
        "state saved": rows["state_saving"].map(fmt.pct),
        "peak memory": rows["peak_source"].map(lambda v: PEAK_SOURCES.get(v, v)),
        "peak": rows["peak_bytes"].map(fmt.nbytes),
        "ddp's peak": rows["baseline_peak_bytes"].map(fmt.nbytes),
        "peak saved": rows["peak_saving"].map(fmt.pct),
        "throughput / ddp's": rows["throughput_ratio"].map(fmt.ratio),
    }).reset_index(drop=True)


def energy_tables(configs: pd.DataFrame, multi_run: bool = False) -> dict[str, pd.DataFrame]:
    """Energy per sample, where GPU telemetry measured it."""
    energy = "energy_per_sample_j"
    return _pivot(having(configs, energy), lambda r: cell(energy, r[energy]), multi_run)


def speedup_table(configs: pd.DataFrame, comparison: twins.Twins, multi_run: bool = False) -> pd.DataFrame:
    frame = twins.speedups(configs, comparison)
    cols = (["run"] if multi_run else []) + ["config_id", "baseline_id", "speedup"]
    for extra in ("scaling_efficiency", "to_target"):
        if extra in frame and frame[extra].notna().any():
            cols.append(extra)
    out = frame[cols].copy()
    out["speedup"] = [twins.speedup_text(r) for _, r in frame.iterrows()]
    if "scaling_efficiency" in out:
        out["scaling_efficiency"] = out["scaling_efficiency"].map(fmt.pct)
    if "to_target" in out:
        out["to_target"] = out["to_target"].map(fmt.ratio)
    return out.rename(columns={"config_id": "config", "baseline_id": "baseline",
                               "scaling_efficiency": "scaling efficiency",
                               "to_target": "to target (time over the baseline's, above 1: sooner)"})


def run_comparison(configs: pd.DataFrame, run_ids: list[str]) -> pd.DataFrame:
    """Several runs side by side: throughput of every config in each run, and each later run
    over the first."""
    first = run_ids[0]
    table = configs.pivot_table(index="config_id", columns="run", values="throughput", aggfunc="first")
    out = pd.DataFrame({"config": table.index})
    for run in run_ids:
        values = table[run] if run in table else pd.Series(index=table.index, dtype=float)
        out[run] = values.map(lambda v: cell("throughput", v)).to_numpy()
    for run in run_ids[1:]:
        if run in table and first in table:
            out[f"{run} / {first}"] = (table[run] / table[first]).map(fmt.ratio).to_numpy()
    return out


def failures(configs: pd.DataFrame, multi_run: bool = False) -> pd.DataFrame:
    bad = configs[configs["status"] != "ok"]
    cols = (["run"] if multi_run else []) + ["config_id", "status", "reason"]
    return bad[cols].rename(columns={"config_id": "config"}).reset_index(drop=True)


def noisy(configs: pd.DataFrame, multi_run: bool = False) -> pd.DataFrame:
    flagged = _flagged(configs, "noisy")
    out = flagged[(["run"] if multi_run else []) + ["config_id", "step_cv"]].copy()
    out["step_cv"] = out["step_cv"].map(lambda v: cell("step_cv", v))
    return out.rename(columns={"config_id": "config", "step_cv": "cv of step times"}).reset_index(drop=True)


def _flagged(configs: pd.DataFrame, name: str) -> pd.DataFrame:
    return configs[(configs["status"] == "ok") & configs[name].fillna(False).astype(bool)] if name in configs \
        else configs.iloc[0:0]


def shared(configs: pd.DataFrame, multi_run: bool = False) -> pd.DataFrame:
    """The configs that shared their cores with other processes (metric ``shared_cores``)."""
    flagged = _flagged(configs, "shared_cores")
    out = flagged[(["run"] if multi_run else []) + ["config_id", "others_cores"]].copy()
    out["others_cores"] = out["others_cores"].map(lambda v: cell("others_cores", v))
    return out.rename(columns={"config_id": "config", "others_cores": "cores other processes used"}) \
        .reset_index(drop=True)


def shared_warning(configs: pd.DataFrame) -> str | None:
    """The report's warning where a measured config shared its cores, or None."""
    flagged = _flagged(configs, "shared_cores")
    if flagged.empty:
        return None
    measured = int((configs["status"] == "ok").sum())
    return (f"{len(flagged)} of {measured} measured configs shared their cores with other processes (they used up "
            f"to {cell('others_cores', flagged['others_cores'].max())} cores; {contention.RULE}): those figures "
            "are lower than an idle machine's and compare fairly only with figures measured beside the same load "
            "(the table under Problems names them)")


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table (no tabulate dependency); every cell through
    fmt.md_cell, since ids, reasons and run names are data."""
    if df.empty:
        return "_none_\n"
    header = fmt.md_row(df.columns)
    sep = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = [fmt.md_row(row) for row in df.itertuples(index=False)]
    return "\n".join([header, sep, *body]) + "\n"
