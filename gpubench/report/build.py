"""Build a report: index.html (self-contained), the PNG charts, results.csv, summary.md."""

from __future__ import annotations

import base64
import html
import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from jinja2 import Environment, FileSystemLoader, select_autoescape

import gpubench
from gpubench import fmt
from gpubench.calibrate import kernel_label
from gpubench.env import emulation_note
from gpubench.errors import InputError
from gpubench.files import write_text_atomic
from gpubench.measure.allocations import history_line, oom_line
from gpubench.report import breakdown, charts, references, tables
from gpubench.report.load import ReportData, load_report_data
from gpubench.results import twins
from gpubench.results.frame import CONFIG_COLUMNS
from gpubench.results.metrics import METRICS, SUMMARY_COLUMNS, cost_line
from gpubench.results.outputs import check_output_dir
from gpubench.results.schema import MEASURED_STATUSES
from gpubench.results.store import RESULTS_FILE, decode_line, read_own, run_env
from gpubench.telemetry import contention

TEMPLATES = Path(__file__).parent / "templates"
# one row per config: its identity and how its repeats went, then every metric of the registry
IDENTITY_CSV_COLUMNS = ["run", "config_id", "config_hash", "workload", "workload_label", "variant", "framework",
                        "device", "device_model",
                        *(c for c in CONFIG_COLUMNS if c not in ("workload", "framework", "device")),
                        "status", "reason", "repeats", "repeats_ok", "ci_kind"]


@dataclass
class Report:
    out: Path
    index: Path
    csv: Path
    markdown: Path
    charts: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def default_out(data: ReportData, base: Path = Path("reports")) -> Path:
    if data.ab is not None:  # the two sides of one A/B: under its id
        name = str(data.ab["id"]).replace("/", "_")
        return base / (name if name not in ("", ".", "..") else "ab")
    return base / "__".join(r.run_id.replace("/", "_") for r in data.runs)


AB_COLUMNS = ("config", "verdict", "baseline", "current", "change [CI]", "n", "note")


def ab_section(data: ReportData) -> dict[str, Any] | None:
    """The verdicts of an A/B's two sides (its ab.json, written by ``gpubench ab`` with the
    gate's own rows): the settings line, the decision, each config's verdict with both sides'
    medians, the change and its interval, and the looks; None for other runs."""
    if data.ab is None:
        return None
    v = data.ab["verdicts"]
    out: dict[str, Any] = {"id": str(data.ab["id"]), "table": None, "header": "", "decision": "", "power": "",
                           "looks": ""}
    if v is None:
        return out
    table = v.get("table")
    rows = [r for r in table if isinstance(r, dict)] if isinstance(table, list) else []
    out["table"] = pd.DataFrame([{("candidate" if k == "current" else "repeats" if k == "n" else k): str(r.get(k, ""))
                                  for k in AB_COLUMNS} for r in rows])
    counts = v.get("counts") if isinstance(v.get("counts"), dict) else {}
    failed = v.get("failed") if isinstance(v.get("failed"), list) else []
    out["decision"] = (("REGRESSION: " if counts.get("regressed") else "no regression: ")
                       + ", ".join(f"{n} {k}" for k, n in counts.items())
                       + (f"; {len(failed)} repeat(s) failed, so the A/B failed (exit 1)" if failed else ""))
    out["header"], out["power"] = str(v.get("header") or ""), str(v.get("power") or "")
    looks = [x for x in v.get("looks") or [] if isinstance(x, dict) and isinstance(x.get("alpha"), (int, float))]
    out["looks"] = "; ".join(f"look {x.get('look')}: {x.get('rounds')} rounds at alpha {x['alpha']:.3g}, "
                             f"{x.get('undecided')} undecided" for x in looks)
    return out


def _html_table(df: pd.DataFrame) -> str:
    if df.empty:
        return '<p class="note">none</p>'
    return df.to_html(index=False, escape=True, border=0, na_rep="-")


def _step_times(data: ReportData) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for run in data.runs:
        for r in run.results:
            times = r.get("metrics", "step_times_ms")
            if r.ok and times:
                label = (f"{run.run_id}: " if data.multi_run else "") + r.config_id
                out.setdefault(label, []).extend(float(t) for t in times if t is not None)
    return out


def _loss_curves(data: ReportData) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """Each workload's configs' loss curves for charts.loss_vs_samples: the median over a
    config's ok repeats at each step all of them took, against the samples trained."""
    repeats: dict[tuple[str, str], list[list[float]]] = {}
    spp: dict[tuple[str, str], int] = {}
    for run in data.runs:
        for r in run.results:
            curve, per = r.get("metrics", "loss", "curve"), r.get("metrics", "samples_per_step")
            if r.ok and curve and per:
                key = (str(r.config.get("workload")), (f"{run.run_id}: " if data.multi_run else "") + r.config_id)
                repeats.setdefault(key, []).append([math.nan if v is None else float(v) for v in curve])
                spp[key] = int(per)
    out: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for (workload, label), curves in repeats.items():
        n = min(len(c) for c in curves)
        median = np.median(np.array([c[:n] for c in curves]), axis=0)
        out.setdefault(workload, {})[label] = ([(k + 1) * spp[workload, label] for k in range(n)],
                                               [float(v) for v in median])
    return out


def _evaluations(data: ReportData, per_epoch: bool = False
                 ) -> tuple[dict[str, dict[str, list[tuple[list[float], list[float]]]]], dict[str, float]]:
    """charts.held_out_curves's lines: every measured repeat's evaluations (seconds, or with
    ``per_epoch`` the epochs of its data set trained: those on a data set only; held-out loss)
    per workload and config, and each workload's target (the lowest of its configs')."""
    out: dict[str, dict[str, list[tuple[list[float], list[float]]]]] = {}
    targets: dict[str, float] = {}
    for run in data.runs:
        for r in run.results:
            evaluations, target = r.get("metrics", "target", "evaluations"), r.get("metrics", "target", "loss")
            epoch = r.get("runtime", "dataset", "samples_per_epoch")
            step = r.get("metrics", "samples_per_step")
            if per_epoch and not (isinstance(epoch, int) and epoch > 0 and isinstance(step, int)):
                continue
            if r.status in MEASURED_STATUSES and evaluations and isinstance(target, (int, float)):
                workload = str(r.config.get("workload"))
                label = (f"{run.run_id}: " if data.multi_run else "") + r.config_id
                losses = [math.nan if e[2] is None else float(e[2]) for e in evaluations]
                x = [e[0] * step / epoch if per_epoch else float(e[1]) for e in evaluations]
                out.setdefault(workload, {}).setdefault(label, []).append((x, losses))
                targets[workload] = min(targets.get(workload, math.inf), float(target))
    return out, targets


def _timeline_path(run_dir: Path, rel: object) -> tuple[Path | None, str]:
    """Where a result's ``telemetry.timeline`` is, or None and why not. The runner writes it as
    ``telemetry/<job>.json`` relative to the run directory, and the report opens nothing else: a
    results file is data (copied, downloaded from CI), and an absolute path, a ``..``, a
    symlink leading out of the run directory or a device or FIFO would have the report read
    (and chart) any file on the machine, or hang on it."""
    if not isinstance(rel, str) or not rel:
        return None, f"not a path ({type(rel).__name__})"
    given = Path(rel)
    if given.is_absolute() or given.drive:
        return None, "an absolute path; expected one relative to the run directory, such as telemetry/<job>.json"
    if ".." in given.parts:
        return None, "a path with '..'; expected one inside the run directory, such as telemetry/<job>.json"
    try:  # a NUL in the name, a symlink loop: not a path to open
        root = run_dir.resolve()
        path = (root / given).resolve()
        if not path.is_relative_to(root):
            return None, "leads outside the run directory (a symlink)"
        if path.exists() and not path.is_file():
            return None, "not a regular file"
    except (OSError, ValueError, RuntimeError) as e:
        return None, f"cannot be resolved ({type(e).__name__})"
    return path, ""


def _timelines(data: ReportData) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """(label, timeline) for the first repeat of each config that saved one, and warnings for
    timeline files that are referenced but missing, unreadable or outside their run directory."""
    out: list[tuple[str, dict[str, Any]]] = []
    notes: list[str] = []
    seen: set[tuple[str, str]] = set()
    for run in data.runs:
        for r in run.results:
            rel = r.get("telemetry", "timeline")
            key = (run.run_id, r.config_id)
            if not rel or key in seen:
                continue
            where = f"{run.path / RESULTS_FILE}: config {r.config_id} repeat {r.repeat}: telemetry.timeline {rel!r}"
            path, why = _timeline_path(run.path, rel)
            if path is None:
                notes.append(f"{where}: {why}; not opened, left out of the charts")
                continue
            try:
                timeline = decode_line(path.read_bytes())  # no deeper than results.store.MAX_DEPTH
                if not isinstance(timeline, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as e:
                notes.append(f"{where}: unreadable ({type(e).__name__}); left out of the charts")
                continue
            seen.add(key)
            out.append((f"{key[1]} ({run.run_id})" if data.multi_run else key[1], timeline))
    return out, notes


def _how_measured(run_meta: dict[str, Any]) -> str:
    suite = run_meta.get("suite") or {}
    d = suite.get("defaults", {})
    m = suite.get("matrix", {})
    def setting(key: str, default: Any) -> str:
        return str(m.get(key, d.get(key, default)))
    repeats = (run_meta.get("args") or {}).get("repeats", 1)
    bound = setting("window_s", 0)
    bounded = (f" (or, where a window would take more than {bound} s, the steps that fit in it at the "
               "warm-up's step time, at least 2: metrics.window_steps)") if bound not in ("0", "0.0") else ""
    return (f"Each config in a fresh process: 1 cold-start step (reported separately), "
            f"{setting('warmup_steps', 5)} warm-up steps, then {setting('windows', 5)} windows of "
            f"{setting('steps', 20)} timed steps{bounded}; {repeats} repeat(s) per config; seed {setting('seed', 0)}. "
            f"Run started {run_meta.get('created_at', '?')}, "
            f"{'completed' if run_meta.get('completed') else 'not completed (interrupted or still running)'}.")


def _env_table(env: dict[str, Any]) -> str:
    rows = []
    for key, value in env.items():
        if key == "frameworks":
            for name, p in (value or {}).items():
                text = (f"{p.get('version')} {json.dumps(p.get('build'))}; devices: "
                        + ", ".join(f"{d['name']} ({d['model']})" for d in p.get("devices", []))
                        if p.get("available") else f"unavailable: {p.get('reason')}")
                rows.append((f"framework {name}", text))
        else:
            rows.append((key, value if isinstance(value, str) else json.dumps(value)))
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _machine_line(env: dict[str, Any]) -> str:
    gpus = ", ".join(g.get("name", "?") for g in env.get("gpus") or []) or "none"
    frameworks = ", ".join(f"{n} {p.get('version')}" for n, p in (env.get("frameworks") or {}).items()
                           if p.get("available"))
    return (f"Host {env.get('hostname', '?')}: CPU {env.get('cpu_model', '?')} "
            f"({env.get('cpu_logical_cores', '?')} logical cores), GPUs: {gpus}; "
            f"Python {env.get('python', '?')}; {frameworks or 'no framework information'}.")


def _counts(configs: pd.DataFrame) -> str:
    counts = configs["status"].value_counts()
    return f"{len(configs)} configs: " + ", ".join(f"{n} {s}" for s, n in counts.items())


@dataclass(frozen=True)
class _Trained:
    """What emulation_note reads of a result's config."""
    config_id: str
    device: str
    precision: str


def precision_notes(data: ReportData) -> list[str]:
    """Per run, where bf16 or fp16 CPU configs trained on a CPU without native support for it
    (per the run's fingerprint): why they are slow, in one line."""
    notes = []
    for run in data.runs:
        trained = [_Trained(r.config_id, r.config["device"], r.config.get("precision", "fp32"))
                   for r in run.results if r.status == "ok" and "device" in r.config]
        if (note := emulation_note(trained, run_env(run.meta, run.results), ran=True)) is not None:
            notes.append(f"{run.run_id}: {note}" if data.multi_run else note)
    return notes


def flop_conventions(data: ReportData) -> list[str]:
    """How the FLOPs behind each MFU were counted, one line per way, with the workloads counted
    that way (``model.flops_counted_by``: the spec's count, or a framework's counter)."""
    ways: dict[str, set[str]] = {}
    for run in data.runs:
        for r in run.results:
            how = r.get("model", "flops_counted_by")
            if isinstance(how, str) and r.get("metrics", "achieved_tflops") is not None:
                ways.setdefault(how, set()).add(str(r.config.get("workload")))
    return [f"FLOPs of {', '.join(sorted(workloads))}: counted by {how}" for how, workloads in ways.items()]


def peaks_used(data: ReportData) -> pd.DataFrame:
    """The peaks the results' two MFUs are against, one row per device, precision and kind: the
    measured one (``mfu``) and the datasheet's dense one (``mfu_datasheet``)."""
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    for run in data.runs:
        for r in run.results:
            peak, sheet = r.get("metrics", "peak"), r.get("metrics", "datasheet")
            if isinstance(peak, dict):
                key = (run.run_id, str(peak.get("device")), str(peak.get("precision")), str(peak.get("measured_at")))
                rows[key] = {**({"run": run.run_id} if data.multi_run else {}),
                             "device": f"{peak.get('device')} ({peak.get('device_name')})",
                             "precision": peak.get("precision"), "MFU": "MFU (measured peak)",
                             "peak per device": fmt.tflops(peak.get("per_device_tflops")),
                             "kernel": kernel_label(peak.get("kernel")),
                             "source": f"{peak.get('source')}, {peak.get('measured_at')}"}
            if isinstance(sheet, dict):
                key = (run.run_id, str(sheet.get("label")), str(sheet.get("precision")), "datasheet")
                rows[key] = {**({"run": run.run_id} if data.multi_run else {}),
                             "device": f"{r.config.get('device')} ({sheet.get('device_name')})",
                             "precision": sheet.get("precision"), "MFU": "MFU (datasheet peak)",
                             "peak per device": fmt.tflops(sheet.get("per_device_tflops")),
                             "kernel": "dense (no 2:4 sparsity)",
                             "source": f"{sheet.get('label')}: {sheet.get('source')}"}
    return pd.DataFrame(list(rows.values()))


def _summary_cells(ok: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """summary.md's metric columns (SUMMARY_COLUMNS), each (header, cells) of the measured configs."""
    out = []
    for c in SUMMARY_COLUMNS:
        # a target's column is there where any config trained to one, reached or not
        shown = "target_reached" if c.metric == "time_to_target_s" else c.metric
        if not c.markdown or (c.optional and (shown not in ok or not ok[shown].notna().any())):
            continue
        if c.metric == "throughput":
            out.append(("samples/s (95% CI)", [fmt.rate_ci(r.throughput, r.throughput_ci_low, r.throughput_ci_high)
                                               + (" *" if r.noisy else "") for r in ok.itertuples()]))
        elif c.metric == "time_to_target_s":
            out.append((c.long, [tables.target_text(r) or "-" for _, r in ok.iterrows()]))
        elif c.metric == "mfu":
            out.append((c.long or c.header, ["above peak" if tables.above_peak(r) else tables.cell("mfu", r["mfu"])
                                   for _, r in ok.iterrows()]))
        else:
            out.append((c.long or c.header, [tables.cell(c.metric, v).removesuffix(" TFLOP/s") for v in ok[c.metric]]))
    return out


def write_markdown(data: ReportData, path: Path, ab: dict[str, Any] | None = None) -> None:
    """A compact summary fit for a CI job summary or a PR comment. Run ids, warnings and notes
    are data (a results file's lines, an exception's message): each goes through fmt.md_cell."""
    c = data.configs
    lines = [f"## gpubench: {fmt.md_cell(', '.join(r.run_id for r in data.runs))}", "", fmt.md_cell(_counts(c)), ""]
    lines += [f"> warning: {fmt.md_cell(w)}" for w in data.warnings]
    if data.warnings:
        lines.append("")
    if ab is not None and ab["table"] is not None:  # ab_section's, made once for the page and this
        lines += [f"### A/B {fmt.md_cell(ab['id'])}: {fmt.md_cell(ab['decision'])}", "", fmt.md_cell(ab["header"]), "",
                  tables.to_markdown(ab["table"]), *([fmt.md_cell(ab["looks"]), ""] if ab["looks"] else [])]
    ok = c[c["status"].isin(MEASURED_STATUSES)]
    table = pd.DataFrame({**({"run": ok["run"]} if data.multi_run else {}), "config": ok["config_id"],
                          **{header: cells for header, cells in _summary_cells(ok)}})
    lines += [tables.to_markdown(table), "`*` noisy (cv of step times > 10%); TFLOP/s: model training FLOPs x "
              "samples/s; MFU (measured peak): of the peak `gpubench calibrate` measured at the config's precision; "
              "MFU (datasheet peak): of the GPU's dense datasheet figure, the convention of published MFUs", ""]
    lines += [line for note in flop_conventions(data) for line in (fmt.md_cell(note), "")]
    if (cost := cost_line(r for run in data.runs for r in run.results)) is not None:
        lines += [fmt.md_cell(cost), ""]
    if (above := tables.above_peak_note(ok)) is not None:
        lines += [f"> MFU above peak: {fmt.md_cell(above)}", ""]
    lines += [line for note in precision_notes(data) for line in (f"> note: {fmt.md_cell(note)}", "")]
    if data.multi_run:
        side_by_side = tables.run_comparison(c, [r.run_id for r in data.runs])
        lines += ["### Runs side by side", "", tables.to_markdown(side_by_side)]
    sections = [*((cmp.title, tables.speedup_table(c, cmp, data.multi_run)) for cmp in twins.COMPARISONS),
                ("Activation checkpointing", tables.checkpointing_table(c, data.multi_run)),
                ("Sharded over replicated (fsdp:N over ddp:N)", tables.sharding_table(c, data.multi_run)),
                ("Beside published figures", references.beside(c, data.multi_run)),
                ("Where time goes (ms per step, gpubench profile)", breakdown.breakdown_table(c, data.multi_run)),
                ("Not measured", tables.failures(c, data.multi_run))]
    for title, t in sections:
        if not t.empty:
            lines += [f"### {title}", "", tables.to_markdown(t)]
    write_text_atomic(path, "\n".join(lines) + "\n")


def write_csv(data: ReportData, path: Path) -> None:
    c = data.configs.copy()
    params = sorted(col for col in c.columns if col.startswith("param_"))
    cols = [col for col in IDENTITY_CSV_COLUMNS + [m.name for m in METRICS] if col in c.columns]
    write_text_atomic(path, c[cols[:3] + params + cols[3:]].to_csv(index=False))


def _profiles(data: ReportData, out: Path) -> list[dict[str, Any]]:
    """Per profiled config (and per oom config with an allocator snapshot): its reading and
    links to its files (trace, operator tables, allocator snapshot), relative to the report.
    A path the result names is followed only inside its run directory (``_timeline_path``)."""
    rows = []
    for run in data.runs:
        for r in run.results:
            profile = r.profile if isinstance(r.profile, dict) else {}
            oom = r.get("metrics", "oom")
            oom = oom if isinstance(oom, dict) else None
            if not profile and oom is None:
                continue
            named = dict(profile.get("files") or {}) if isinstance(profile.get("files"), dict) else {}
            history = profile.get("memory_history") if isinstance(profile.get("memory_history"), dict) else None
            if history and history.get("file"):
                named["memory snapshot"] = history["file"]
            if oom and oom.get("snapshot"):
                named["memory snapshot at the oom"] = oom["snapshot"]
            links = []
            for name, rel in named.items():
                path, _ = _timeline_path(run.path, rel)
                if path is not None and path.exists():
                    links.append({"name": name, "href": os.path.relpath(path, out.resolve())})
            notes = [profile["reading"]] if profile.get("reading") else []
            if profile.get("error"):
                notes.append(f"not profiled: {profile['error']}")
            if history is not None:
                notes.append(history_line(history))
            if oom is not None:
                notes.append(oom_line(oom))
            rows.append({"run": run.run_id, "config": r.config_id, "status": r.status,
                         "profiler": profile.get("profiler") or "", "notes": notes, "links": links})
    return rows


def _advice(data: ReportData) -> list[dict[str, Any]]:
    """Each run's ``gpubench advise`` outcome (its advice.json): the ranked table, what does not
    apply and the best config's lines. A file that cannot be read is a warning, never a failure."""
    out = []
    for run in data.runs:
        path = run.path / "advice.json"
        if not os.path.lexists(path):
            continue
        try:
            advice = json.loads(read_own(path))
            rows = [*(advice.get("rows") or []), *([advice["combination"]] if advice.get("combination") else [])]
            frame = pd.DataFrame([{"practice": r["practice"], "verdict": r["verdict"],
                                   "speed-up": fmt.ratio(r.get("speedup")),
                                   "interval": (f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
                                                if r.get("ci_low") is not None and r.get("ci_high") is not None
                                                else "-"),
                                   "loss vs baseline": (f"{100 * (r['loss_ratio'] - 1):+.1f}% "
                                                        f"({r['loss_samples']:,} samples)"
                                                        if r.get("loss_ratio") is not None
                                                        and r.get("loss_samples") is not None else "-"),
                                   "note": r.get("reason") or ""} for r in rows])
            out.append({"run": run.run_id, "baseline": advice.get("baseline"), "table": _html_table(frame),
                        "failed": advice.get("baseline_failed"),
                        "skipped": [f"{s['name']}: {s['reason']}" for s in advice.get("skipped") or []],
                        "best": (advice.get("best") or {}).get("practice"), "lines": advice.get("best_lines") or []})
        except (OSError, ValueError, KeyError, TypeError, RecursionError, InputError) as e:
            data.warnings.append(f"{path}: unreadable ({type(e).__name__}: {e}); the advice is left out of the "
                                 "report")
    return out


def build_report(run_dirs: list[Path], out: Path | None = None) -> Report:
    check_output_dir(out, "--out")
    data = load_report_data(run_dirs)
    out = out or default_out(data)
    chart_dir = out / "charts"
    chart_dir.mkdir(parents=True, exist_ok=True)
    c = data.configs
    multi = data.multi_run

    timelines, timeline_notes = _timelines(data)
    data.warnings.extend(timeline_notes)
    if (busy := tables.shared_warning(c)) is not None:
        data.warnings.append(busy)
    made = [p for p in (
        charts.throughput_vs_batch(c, chart_dir / "throughput_vs_batch.png"),
        charts.tokens_vs_seq_len(c, chart_dir / "tokens_vs_seq_len.png"),
        charts.mfu_vs_tensor(c, chart_dir / "mfu_vs_tensor.png"),
        charts.speedup_bars(c, chart_dir / "speedups.png"),
        charts.step_time_boxes(_step_times(data), chart_dir / "step_times.png"),
        charts.loss_vs_samples(_loss_curves(data), chart_dir / "loss_vs_samples.png"),
        charts.held_out_curves(*_evaluations(data), chart_dir / "held_out_vs_time.png"),
        charts.held_out_curves(*_evaluations(data, per_epoch=True), chart_dir / "held_out_vs_epoch.png",
                               per_epoch=True),
        charts.memory_vs_batch(c, chart_dir / "memory_vs_batch.png"),
        charts.per_device_vs_devices(c, chart_dir / "per_device_vs_devices.png"),
        charts.telemetry_timelines(timelines, "gpu", chart_dir / "telemetry_gpu.png"),
        charts.telemetry_timelines(timelines, "host", chart_dir / "telemetry_host.png"),
        breakdown.breakdown_chart(c, chart_dir / "breakdown.png"),
    ) if p is not None]
    n_gpu = sum(1 for _, t in timelines if t.get("gpu"))
    n_host = sum(1 for _, t in timelines if t.get("host"))
    if not timelines:
        telemetry_note = "No telemetry timelines in these results."
    elif max(n_gpu, n_host) > charts.TIMELINE_MAX_ROWS:
        telemetry_note = (f"Telemetry charts show the first {charts.TIMELINE_MAX_ROWS} configs (of {n_host} with "
                          f"host and {n_gpu} with GPU timelines); every timeline is in the run directory's "
                          "telemetry/ folder.")
    else:
        telemetry_note = ""

    ci_kinds = set(c.get("ci_kind", pd.Series(dtype=str)).dropna())
    ci_kind_notes = {"within-process": "within one process: one repeat per config",
                     "between-repeats": "between repeats: each repeat a fresh process"}
    ci_note = "; ".join(ci_kind_notes[k] for k in sorted(ci_kinds)) or ci_kind_notes["within-process"]
    ab = ab_section(data)
    context = {
        "title": f"A/B {ab['id']}: candidate against baseline" if ab else ", ".join(r.run_id for r in data.runs),
        "ab": ab,
        "ab_table": _html_table(ab["table"]) if ab and ab["table"] is not None else None,
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "version": gpubench.__version__,
        "warnings": data.warnings,
        "notes": precision_notes(data),
        "counts": _counts(c),
        "comparison": _html_table(tables.run_comparison(c, [r.run_id for r in data.runs])) if multi else None,
        "ci_note": ci_note,
        "throughput": {k: _html_table(v) for k, v in tables.throughput_tables(c, multi).items()},
        "speedups": [{"title": cmp.title, "note": cmp.note, "table": _html_table(t)}
                     for cmp in twins.COMPARISONS
                     if not (t := tables.speedup_table(c, cmp, multi)).empty],
        "charts": [{"name": p.name, "data": base64.b64encode(p.read_bytes()).decode()} for p in made],
        "telemetry_note": telemetry_note,
        "flops": {k: _html_table(v) for k, v in tables.flops_tables(c, multi).items()},
        "peaks": _html_table(peaks_used(data)),
        "memory": {k: _html_table(v) for k, v in tables.memory_tables(c, multi).items()},
        "checkpointing": (_html_table(t) if not (t := tables.checkpointing_table(c, multi)).empty else None),
        "sharding": (_html_table(t) if not (t := tables.sharding_table(c, multi)).empty else None),
        "published": (_html_table(t) if not (t := references.beside(c, multi)).empty else None),
        "breakdown": _html_table(bd) if not (bd := breakdown.breakdown_table(c, multi)).empty else None,
        "profiles": _profiles(data, out),
        "advice": _advice(data),
        "multi_run": multi,
        "energy": {k: _html_table(v) for k, v in tables.energy_tables(c, multi).items()},
        "failures": _html_table(tables.failures(c, multi)),
        "noisy": _html_table(tables.noisy(c, multi)),
        "shared": _html_table(tables.shared(c, multi)),
        "shared_rule": contention.RULE,
        "runs": [{"run_id": r.run_id, "how": _how_measured(r.meta),
                  "machine": _machine_line(run_env(r.meta, r.results)),
                  "env": _env_table(run_env(r.meta, r.results)),
                  "suite": json.dumps(r.meta.get("suite", {}), indent=2)} for r in data.runs],
    }
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]))
    index = out / "index.html"
    write_text_atomic(index, env.get_template("report.html.j2").render(**context))
    csv = out / "results.csv"
    write_csv(data, csv)
    md = out / "summary.md"
    write_markdown(data, md, ab)
    return Report(out=out, index=index, csv=csv, markdown=md, charts=made, warnings=data.warnings)
