"""Report charts (matplotlib, Agg): one consistent style, axes with units, legends that name
framework and precision. Each function writes one PNG and returns its path, or None when the
data has nothing to show (e.g. a single batch size). PNGs are written atomically, like every
output file, so a report killed midway never leaves half a chart."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

# colour: the same framework x precision has the same colour in every chart (its backend's)
from gpubench.backends import colour, display_name  # noqa: E402
from gpubench.files import write_atomic  # noqa: E402
from gpubench.results.twins import COMPARISONS, by_devices, speedup_text, speedups  # noqa: E402

STYLE: dict[Any, Any] = {  # matplotlib rc settings
    "figure.dpi": 110,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "font.size": 9,
    "axes.titlesize": 10,
    "legend.fontsize": 8,
}
RUN_LINESTYLES = ["-", "--", ":", "-."]
_MPL = tuple(int(x) for x in matplotlib.__version__.split(".")[:2])


LABEL_WIDTH = 48  # characters a legend entry or tick label holds a line; longer ones wrap, never cut


def _save(fig: Any, path: Path) -> None:
    """The figure with everything drawn inside it (``bbox_inches="tight"``: a legend or label
    outside the axes grows the image instead of being cut off), written atomically; then closed."""
    write_atomic(path, lambda p: fig.savefig(p, format="png", bbox_inches="tight"))
    plt.close(fig)


def wrap(label: str, width: int = LABEL_WIDTH) -> str:
    """A label over lines of at most ``width`` characters, broken after a ``-`` or a space (within
    a longer part after ``_`` or ``=``): a config id of 100 characters stays whole, on two or
    three lines, never cut to an ellipsis."""
    pieces = []
    for piece in filter(None, re.findall(r"[^- ]*[- ]?", label)):  # after a dash or a space, else after _ or =
        if len(piece) <= width:
            pieces.append(piece)
            continue
        pieces += [x[i:i + width] for x in re.findall(r"[^_=]*[_=]?", piece) for i in range(0, len(x), width)]
    lines = [""]
    for piece in filter(None, pieces):
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(line.rstrip() for line in lines)


def _legends(fig: Any, axes: list[Any]) -> None:
    """The legends of a laid-out figure (call after ``tight_layout``): inside each axes where
    every label is short; else one legend for the figure, below it, its labels wrapped (every
    panel draws a series alike, and a long label inside the axes would cover the data)."""
    found: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            found.setdefault(label, handle)
    if not found:
        return
    if all(len(label) <= 30 for label in found):
        for ax in axes:
            if ax.get_legend_handles_labels()[1]:
                ax.legend(loc="best")
        return
    fig.legend(list(found.values()), [wrap(label) for label in found], loc="upper left", bbox_to_anchor=(0.01, 0.0),
               ncol=2 if len(found) > 4 else 1, frameon=False)


def _series_label(framework: str, precision: str, variant: str = "", run: str | None = None) -> str:
    label = f"{display_name(framework)} {precision}" + (f" {variant}" if variant else "")
    return f"{label} ({run})" if run else label


VARIANT_MARKERS = ["o", "s", "^", "D", "v", "P", "X"]


def _series(ok: pd.DataFrame) -> list[str]:
    """Each row's line within a framework x precision: its parallel strategy (unless single) and
    the settings that tell it from the others (its variant)."""
    par = ok["parallelism"] if "parallelism" in ok else pd.Series("single", index=ok.index)
    return [" ".join(x for x in (p if p != "single" else "", v) if x) for p, v in zip(par, ok["variant"])]


def dodge(k: int, n: int, step: float = 0.06) -> float:
    """The factor that moves series ``k`` of ``n`` sideways on a log-2 batch axis (centred, a
    ``step`` of an octave apart), so that series at the same batch and value do not hide each
    other; the ticks stay at the true batch sizes."""
    return float(2 ** ((k - (n - 1) / 2) * step))


def _lines_by_batch(configs: pd.DataFrame, value: str, path: Path, ylabel: str, title: str,
                    ci: tuple[str, str] | None = None, scale: float = 1.0) -> Path | None:
    ok = configs[configs[value].notna()]
    if ok.empty or ok.groupby(["run", "config_id"]).ngroups < 2:
        return None
    workloads = list(dict.fromkeys(ok["workload_label"]))
    devices = sorted(ok["device"].unique())
    runs = list(dict.fromkeys(ok["run"]))
    ok = ok.assign(series=_series(ok))
    variants = sorted(set(ok["series"]))
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(workloads), len(devices), figsize=(5.2 * len(devices), 3.4 * len(workloads)),
                                 squeeze=False)
        for i, workload in enumerate(workloads):
            for j, device in enumerate(devices):
                ax = axes[i][j]
                g = ok[(ok["workload_label"] == workload) & (ok["device"] == device)]
                groups = list(g.groupby(["run", "framework", "precision", "series"], sort=True))
                for k, ((run, fw, prec, var), s) in enumerate(groups):
                    s = s[s["batch_trained"].notna()].sort_values("batch_trained")
                    x = s["batch_trained"].astype(float).to_numpy() * dodge(k, len(groups))
                    y = s[value].astype(float).to_numpy() * scale
                    style = RUN_LINESTYLES[runs.index(run) % len(RUN_LINESTYLES)]
                    label = _series_label(fw, prec, var, run if len(runs) > 1 else None)
                    marker = VARIANT_MARKERS[variants.index(var) % len(VARIANT_MARKERS)]
                    # a later run's markers hollow: two runs' points tell apart where no line joins them
                    kw: dict[str, Any] = {"color": colour(fw, prec), "linestyle": style, "marker": marker,
                                          "markersize": 4, "label": label,
                                          **({"markerfacecolor": "white"} if runs.index(run) % 2 else {})}
                    if ci is not None:
                        lo = s[ci[0]].astype(float).to_numpy() * scale
                        hi = s[ci[1]].astype(float).to_numpy() * scale
                        ax.errorbar(x, y, yerr=[y - lo, hi - y], capsize=3, alpha=0.85, **kw)
                    else:
                        ax.plot(x, y, alpha=0.85, **kw)
                ax.set_xscale("log", base=2)
                sizes = sorted(g["batch_trained"].dropna().unique())  # a "max" config at the batch it found
                if sizes:
                    ax.set_xticks(sizes, [str(int(b)) for b in sizes])
                    ax.minorticks_off()
                    # half an octave beyond the outer sizes: room for the nudged series at either end
                    ax.set_xlim(sizes[0] / 2**0.5, sizes[-1] * 2**0.5)
                ax.set_title(f"{workload} on {device}")
                ax.set_xlabel("batch size (per device and micro-batch; series nudged apart)")
                ax.set_ylabel(ylabel)
                ax.set_ylim(0, ax.get_ylim()[1] * 1.08)  # from 0, with room above the top whisker
                if not ax.has_data():
                    ax.text(0.5, 0.5, "no measurements", ha="center", va="center", transform=ax.transAxes)
        fig.suptitle(title)
        fig.tight_layout()
        _legends(fig, [ax for row in axes for ax in row])
        _save(fig, path)
    return path


def throughput_vs_batch(configs: pd.DataFrame, path: Path) -> Path | None:
    return _lines_by_batch(configs[configs["status"] == "ok"], "throughput", path, "throughput (samples/s)",
                           "Training throughput vs batch size (median, 95% CI)", ci=("throughput_ci_low",
                                                                                     "throughput_ci_high"))


def memory_vs_batch(configs: pd.DataFrame, path: Path) -> Path | None:
    return _lines_by_batch(configs, "peak_memory_bytes", path, "peak memory (MiB)",
                           "Peak memory vs batch size\n(GPU: allocator peak; CPU: process peak RSS)",
                           scale=1 / 2**20)


def per_device_vs_devices(configs: pd.DataFrame, path: Path) -> Path | None:
    """Throughput per device and training state per device against N, a line per strategy
    (``single`` is each strategy's N = 1) at one per-device batch: how a strategy scales and what
    sharding saves. None unless some strategy was measured at two or more N."""
    ok = by_devices(configs)
    ok = ok[ok["throughput_per_device"].notna()] if not ok.empty else ok
    if ok.empty:
        return None
    group = ["workload_label", "framework", "precision", "batch_trained", "variant", "run"]
    lines: list[tuple[tuple[Any, ...], str, pd.DataFrame]] = []
    for keys, g in ok.groupby(group, sort=True, dropna=False):
        single = g[g["kind"] == "single"]
        for kind, s in g[g["kind"] != "single"].groupby("kind", sort=True):
            points = pd.concat([single, s]).sort_values("n")
            if points["n"].nunique() >= 2:
                lines.append((keys, str(kind), points))
    if not lines:
        return None
    workloads = list(dict.fromkeys(keys[0] for keys, _, _ in lines))
    runs = list(dict.fromkeys(ok["run"]))
    kinds = sorted({kind for _, kind, _ in lines})
    panels = (("throughput_per_device", "throughput per device (samples/s)", 1.0),
              ("state_bytes_per_device", "training state per device (MiB)", 1 / 2**20))
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(workloads), 2, figsize=(10.4, 3.4 * len(workloads)), squeeze=False)
        for (workload, fw, prec, batch, variant, run), kind, points in lines:
            label = _series_label(fw, prec, f"{kind} bs {int(batch)}" + (f" {variant}" if variant else ""),
                                  run if len(runs) > 1 else None)
            for ax, (column, _, scale) in zip(axes[workloads.index(workload)], panels):
                known = points[points[column].notna()]
                ax.plot(known["n"].to_numpy(), known[column].astype(float).to_numpy() * scale, label=label,
                        color=colour(fw, prec), marker=VARIANT_MARKERS[kinds.index(kind) % len(VARIANT_MARKERS)],
                        linestyle=RUN_LINESTYLES[kinds.index(kind) % len(RUN_LINESTYLES)], alpha=0.85)
        for workload, row in zip(workloads, axes):
            for ax, (_, ylabel, _) in zip(row, panels):
                ns = sorted({int(n) for _, _, p in lines for n in p["n"]})
                ax.set_xscale("log", base=2)
                ax.set_xticks(ns, [str(n) for n in ns])
                ax.minorticks_off()
                ax.set_xlabel("N (devices; 1: single)")
                ax.set_ylabel(ylabel)
                ax.set_title(workload)
                ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
                if not ax.has_data():
                    ax.text(0.5, 0.5, "not counted", ha="center", va="center", transform=ax.transAxes)
        fig.suptitle("Per device against N, at one per-device batch (state: parameters, gradients, optimizer)")
        fig.tight_layout()
        _legends(fig, [ax for row in axes for ax in row])
        _save(fig, path)
    return path


def _without_seq_len(label: str) -> str:
    """A language model's workload label without its sequence length (``gpt_..._seq_len128_...``:
    the panel its sequence lengths share)."""
    return re.sub(r"_seq_len\d+", "", label)


def tokens_vs_seq_len(configs: pd.DataFrame, path: Path) -> Path | None:
    """A language model's tokens/s against its sequence length (median, 95% CI): a panel per
    model (its other parameters) x device x batch size, a line per framework x precision x the
    other settings. None unless some line has two sequence lengths or more."""
    needed = {"tokens_per_s", "tokens_per_sample"}
    if not needed <= set(configs.columns):
        return None
    ok = configs[(configs["status"] == "ok") & configs["tokens_per_s"].notna() & configs["tokens_per_sample"].notna()]
    if ok.empty:
        return None
    ok = ok.assign(panel=[f"{_without_seq_len(w)} on {d}, batch {int(b)}" if pd.notna(b) else
                          f"{_without_seq_len(w)} on {d}"
                          for w, d, b in zip(ok["workload_label"], ok["device"], ok["batch_trained"])],
                   series=_series(ok))
    keys = ["panel", "run", "framework", "precision", "series"]
    if (ok.groupby(keys)["tokens_per_sample"].nunique() < 2).all():
        return None
    panels = list(dict.fromkeys(ok["panel"]))
    runs = list(dict.fromkeys(ok["run"]))
    variants = sorted(set(ok["series"]))
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(panels), 1, figsize=(6.2, 3.6 * len(panels)), squeeze=False)
        for i, panel in enumerate(panels):
            ax = axes[i][0]
            for (run, fw, prec, var), g in ok[ok["panel"] == panel].groupby(keys[1:], sort=True):
                g = g.sort_values("tokens_per_sample")
                n = g["tokens_per_sample"].astype(float).to_numpy()
                y = g["tokens_per_s"].astype(float).to_numpy()
                lo = g["throughput_ci_low"].astype(float).to_numpy() * n
                hi = g["throughput_ci_high"].astype(float).to_numpy() * n
                ax.errorbar(n, y, yerr=[y - lo, hi - y], capsize=3, color=colour(fw, prec),
                            linestyle=RUN_LINESTYLES[runs.index(run) % len(RUN_LINESTYLES)],
                            marker=VARIANT_MARKERS[variants.index(var) % len(VARIANT_MARKERS)], markersize=4,
                            label=_series_label(fw, prec, var, run if len(runs) > 1 else None))
            lengths = sorted(ok[ok["panel"] == panel]["tokens_per_sample"].astype(int).unique())
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [str(t) for t in lengths])
            ax.minorticks_off()
            ax.set_title(panel)
            ax.set_xlabel("sequence length (tokens)")
            ax.set_ylabel("tokens/s")
            ax.set_ylim(bottom=0)
        fig.suptitle("Language model: tokens/s vs sequence length (median, 95% CI)")
        fig.tight_layout()
        _legends(fig, list(axes[:, 0]))
        _save(fig, path)
    return path


def mfu_vs_tensor(configs: pd.DataFrame, path: Path) -> Path | None:
    """MFU against tensor-core activity (NVML GPM), a point per config: what share of the peak a
    config reached against how busy the tensor cores were. None unless two configs have both."""
    if not {"mfu", "tensor_active_pct"} <= set(configs.columns):
        return None
    ok = configs[(configs["status"] == "ok") & configs["mfu"].notna() & configs["tensor_active_pct"].notna()]
    if len(ok) < 2:
        return None
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.2, 4.4))
        for (fw, prec), g in ok.groupby(["framework", "precision"], sort=True):
            ax.scatter(g["tensor_active_pct"].astype(float), g["mfu"].astype(float) * 100, color=colour(fw, prec),
                       label=_series_label(fw, prec), s=24)
        ax.set_xlim(0, 100)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("tensor-core activity (% of the time, NVML GPM)")
        ax.set_ylabel("MFU (% of the measured peak)")
        fig.suptitle("MFU against tensor-core activity, a point per config")
        fig.tight_layout()
        _legends(fig, [ax])
        _save(fig, path)
    return path


def speedup_bars(configs: pd.DataFrame, path: Path) -> Path | None:
    panels = [(c, speedups(configs, c)) for c in COMPARISONS]
    panels = [(c, f) for c, f in panels if not f.empty]
    if not panels:
        return None
    runs = list(dict.fromkeys(configs["run"]))
    with plt.rc_context(STYLE):
        heights = [max(1.6, 0.28 * len(f) + 1.0) for _, f in panels]
        fig, axes = plt.subplots(len(panels), 1, figsize=(9, sum(heights)), squeeze=False,
                                 gridspec_kw={"height_ratios": heights})
        for ax, (comparison, f) in zip(axes[:, 0], panels):
            labels = [(f"{r['run']}: " if len(runs) > 1 else "") + r["config_id"] for _, r in f.iterrows()]
            values = f["speedup"].to_numpy(dtype=float)
            low = f["speedup_low"].to_numpy(dtype=float)
            high = f["speedup_high"].to_numpy(dtype=float)
            decided = f["decided"].fillna(False).astype(bool).to_numpy()
            # colour only for a decided ratio (its range excludes 1, neither side noisy); grey and
            # hatched otherwise, so that a point figure the noise allows either way reads as such
            colors = ["tab:green" if d and v >= 1 else "tab:red" if d else "tab:gray" for v, d in zip(values, decided)]
            y = np.arange(len(values))
            bars = ax.barh(y, values, color=colors, alpha=0.8)
            for bar, d in zip(bars, decided):
                if not d:
                    bar.set_hatch("//")
            known = ~(np.isnan(low) | np.isnan(high))
            ax.errorbar(values[known], y[known], xerr=[values[known] - low[known], high[known] - values[known]],
                        fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
            ax.axvline(1.0, color="black", linewidth=0.8)
            ax.set_yticks(y, [wrap(label, 60) for label in labels], fontsize=7)
            ax.invert_yaxis()
            for yi, r in zip(y, (r for _, r in f.iterrows())):
                end = r["speedup_high"] if pd.notna(r["speedup_high"]) else r["speedup"]
                ax.text(end, yi, f" {speedup_text(r)}", va="center", fontsize=7)
            ax.set_xlabel("speed-up (throughput ratio; 1 = same speed); whiskers: the range the two 95% "
                          "intervals allow\ngrey, hatched: a noisy side, or a range that includes 1")
            ax.set_title(f"{comparison.title} ({comparison.short})")
            top = np.nanmax(np.concatenate([values, high])) if len(values) else 1.0
            ax.set_xlim(0, max(top * 1.35, 1.2))
        fig.tight_layout()
        _save(fig, path)
    return path


def step_time_boxes(step_times: dict[str, list[float]], path: Path) -> Path | None:
    """Distribution of raw step times per config (box: IQR, whiskers: 5th-95th percentile)."""
    items = [(k, v) for k, v in step_times.items() if v]
    if not items:
        return None
    with plt.rc_context(STYLE):
        labels = [wrap(k, 60) for k, _ in items]
        lines = sum(label.count("\n") + 1 for label in labels)  # a wrapped label's lines need room
        fig, ax = plt.subplots(figsize=(9, max(2.2, 0.3 * len(items) + 0.12 * (lines - len(items)) + 1.2)))
        horizontal = {"orientation": "horizontal"} if _MPL >= (3, 10) else {"vert": False}
        ax.boxplot([v for _, v in items], whis=(5, 95), showfliers=True, flierprops={"markersize": 2, "alpha": 0.5},
                   **horizontal)
        ax.set_yticks(np.arange(1, len(items) + 1), labels, fontsize=7)
        ax.invert_yaxis()
        values = np.concatenate([np.asarray(v, dtype=float) for _, v in items])
        if values.min() > 0 and values.max() / values.min() >= 10:  # a log scale where the times span a decade
            ax.set_xscale("log")
            ax.set_xlabel("step time (ms, log scale)")
        else:
            ax.set_xlabel("step time (ms)")
        ax.set_title("Step-time distributions (box: IQR; whiskers: 5th-95th percentile; dots: outliers)")
        fig.tight_layout()
        _save(fig, path)
    return path


# the loss curves' panels: one per workload; the others are named in the chart's title
LOSS_MAX_PANELS = 6


def _workload_panels(panels: dict[str, Any], path: Path, title: str, xlabel: str, ylabel: str,
                     draw: Callable[[Any, str, Any], None]) -> Path | None:
    """A loss chart: a panel per workload (the first LOSS_MAX_PANELS; the others counted in the
    title), ``draw(ax, workload, its lines)`` drawing each."""
    groups = [(w, c) for w, c in panels.items() if c][:LOSS_MAX_PANELS]
    if not groups:
        return None
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(groups), 1, figsize=(8, 2.8 * len(groups)), squeeze=False)
        for ax, (workload, lines) in zip(axes[:, 0], groups):
            draw(ax, workload, lines)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_title(wrap(workload, 80))
        more = len(panels) - len(groups)
        fig.suptitle(title + (f"; {more} more workload(s) in the results" if more > 0 else ""), fontsize=10)
        fig.tight_layout()
        _legends(fig, list(axes[:, 0]))
        _save(fig, path)
    return path


def loss_vs_samples(curves: dict[str, dict[str, tuple[list[int], list[float]]]], path: Path) -> Path | None:
    """The training loss of every step against the samples trained (step k: k x samples_per_step),
    a panel per workload and a line per config: the median over its repeats at each step they
    all took. ``curves``: workload -> config label -> (samples, losses). Configs of one panel are
    compared at the same samples, whatever their batch or step count."""
    def draw(ax: Any, workload: str, lines: dict[str, tuple[list[int], list[float]]]) -> None:
        for label, (samples, losses) in lines.items():
            ax.plot(samples, losses, lw=1.2, label=wrap(label, 50))

    return _workload_panels(curves, path, "Training loss against samples (every step; a line per config, the median "
                            "over its repeats)", "samples trained", "training loss", draw)


def held_out_curves(runs: dict[str, dict[str, list[tuple[list[float], list[float]]]]], targets: dict[str, float],
                    path: Path, per_epoch: bool = False) -> Path | None:
    """A target's evaluations: the held-out loss against the seconds since the first step (the
    clock of the time to target), or (``per_epoch``) against the epochs of a data set trained, a
    panel per workload, a colour per config and a line per repeat, the target dashed. ``runs``:
    workload -> config label -> [(seconds or epochs, losses)] of its repeats; ``targets``:
    workload -> its configs' target (the lowest, where they differ)."""
    def draw(ax: Any, workload: str, lines: dict[str, list[tuple[list[float], list[float]]]]) -> None:
        for i, (label, repeats) in enumerate(lines.items()):
            for k, (seconds, losses) in enumerate(repeats):
                ax.plot(seconds, losses, lw=1.2, marker=".", color=f"C{i % 10}",
                        label=wrap(label, 50) if k == 0 else None)
        ax.axhline(targets[workload], color="black", ls="--", lw=0.8, label="target")

    against, x_label = ("epochs", "epochs of the training split") if per_epoch else ("time",
                                                                                     "seconds from the first step")
    return _workload_panels(runs, path, f"Held-out loss against {against} (every evaluation; a line per repeat, a "
                            "colour per config)", x_label, "held-out loss", draw)


# --- telemetry timelines -----------------------------------------------------------------------

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")  # GPUs of a config
TIMELINE_MAX_ROWS = 12  # configs per timeline figure; the rest are named in the report
PHASE_COLORS = {"cold_start": ("#bdbdbd", "cold start"), "warmup": ("#fdd0a2", "warm-up"),
                "window": ("#c7e9c0", "measured window")}
# (sample field, y label, scale) per panel; GPU timelines and host timelines
GPU_PANELS = [("util_gpu_pct", "GPU util (%)", 1.0), ("mem_used_bytes", "GPU memory (GiB)", 1 / 2**30),
              ("power_w", "power (W)", 1.0), ("sm_clock_mhz", "SM clock (MHz)", 1.0)]
HOST_PANELS = [("cpu_percent", "worker CPU (%; 100 = 1 core)", 1.0), ("rss_bytes", "worker RSS (GiB)", 1 / 2**30),
               ("system_cpu_percent", "machine CPU (%; 100 = all cores)", 1.0),
               ("others_cpu_percent", "other processes' CPU (%; 100 = 1 core)", 1.0)]


def _shade_phases(ax: Any, phases: list[dict[str, Any]]) -> None:
    for p in phases:
        kind = "window" if p["name"].startswith("window_") else p["name"]
        color, _ = PHASE_COLORS.get(kind, ("#eeeeee", kind))
        ax.axvspan(p["start_ms"] / 1000.0, p["end_ms"] / 1000.0, color=color, alpha=0.6, lw=0, zorder=0)


def telemetry_timelines(timelines: list[tuple[str, dict[str, Any]]], kind: str, path: Path) -> Path | None:
    """One row per config, one panel per quantity (``kind`` "gpu": utilisation, memory, power,
    SM clock; "host": worker CPU % and RSS), time on x from the config's first step, with the
    cold start, warm-up and measured windows shaded. ``timelines`` is (label, timeline file
    contents); configs without samples of that kind are skipped."""
    panels = GPU_PANELS if kind == "gpu" else HOST_PANELS
    rows = [(label, tl) for label, tl in timelines if tl.get(kind)][:TIMELINE_MAX_ROWS]
    if not rows:
        return None
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(rows), len(panels), figsize=(3.6 * len(panels), 1.9 * len(rows) + 0.9),
                                 squeeze=False, layout="constrained")
        for r, (label, tl) in enumerate(rows):
            # a multi-GPU config: one line per device (GPU samples carry their NVML index)
            series: dict[Any, list[dict[str, Any]]] = {}
            for s in tl[kind]:
                series.setdefault(s.get("index") if kind == "gpu" else None, []).append(s)
            for c, (field, ylabel, scale) in enumerate(panels):
                ax = axes[r][c]
                _shade_phases(ax, tl.get("phases", []))
                drawn = False
                for n, (index, samples) in enumerate(sorted(series.items(), key=lambda kv: str(kv[0]))):
                    pts = [(s["t_ms"] / 1000.0, s[field] * scale) for s in samples if s.get(field) is not None]
                    if pts:
                        ax.plot(*zip(*pts), lw=1.1, color=PALETTE[n % len(PALETTE)],
                                marker="." if len(pts) < 30 else None, ms=3,
                                label=f"GPU {index}" if len(series) > 1 else None)
                        drawn = True
                if drawn and len(series) > 1 and c == 0:
                    ax.legend(fontsize=6, loc="lower right")
                if not drawn:
                    ax.text(0.5, 0.5, "not supported", transform=ax.transAxes, ha="center", va="center",
                            color="#7f7f7f")
                if field == "power_w" and tl.get("power_source"):
                    ylabel = f"power (W, {tl['power_source']})"
                ax.set_ylabel(ylabel, fontsize=7)
                ax.set_ylim(0, 105) if field in ("util_gpu_pct", "system_cpu_percent") else ax.set_ylim(bottom=0)
                if r == len(rows) - 1:
                    ax.set_xlabel("time since the first step (s)")
                if c == 0:
                    ax.set_title(label, fontsize=7, loc="left")
        handles = [plt.Rectangle((0, 0), 1, 1, color=color, alpha=0.6) for color, _ in PHASE_COLORS.values()]
        labels = [name for _, name in PHASE_COLORS.values()]
        fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), frameon=False)
        interval = rows[0][1].get("interval_ms" if kind == "gpu" else "host_interval_ms")
        every = f", a sample every {interval:g} ms" if interval else ""
        fig.suptitle(("GPU telemetry (NVML" if kind == "gpu" else "Host telemetry (psutil") + f"{every})",
                     x=0.01, ha="left", fontsize=10)
        _save(fig, path)
    return path
