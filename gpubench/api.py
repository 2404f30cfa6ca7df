"""The Python API for a notebook: one call runs gpubench's isolated sweep of a model and returns
the report's table of it (``benchmark``), or advises on one config (``advise``).

    from gpubench.api import benchmark
    df = benchmark("mymodels:small_convnet", input_shape=(3, 32, 32), num_classes=10,
                            precision=["fp32", "amp-bf16"], batch_size=[32, 128])
    df[["config_id", "status", "throughput", "mfu"]]

Every config still trains in a fresh worker process (warm-up, windows, statuses), exactly as
``gpubench run`` does: the call writes a suite for the keyword settings, runs it into ``out``
(a run directory the report, the gate and the history read like any other), and returns one
row per config, as the report's tables show it. The factory is imported by the workers from
where this process finds it (the working directory, and the directory of the module the
factory is in).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

from gpubench.errors import InputError
from gpubench.gate import THRESHOLD


def _code_path(refs: list[str]) -> tuple[str, ...]:
    """Where this process imports the user's modules from: the working directory, then the
    directory holding each ``module:function``'s top-level package or module."""
    dirs = [os.getcwd()]
    for ref in refs:
        head, sep, _ = ref.partition(":")
        if not sep or head in ("torchvision", "timm", "hf", "keras"):
            continue
        top = head.split(".")[0]
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        origin = spec.origin if spec is not None else None
        if origin:
            path = Path(origin).resolve()
            dirs.append(str(path.parent.parent if path.name == "__init__.py" else path.parent))
    return tuple(dict.fromkeys(dirs))


def benchmark(workload: str | list[str], *, repeats: int = 1, out: str | Path = "runs", name: str = "notebook",
              report: bool = False, quiet: bool = True, **settings: Any) -> Any:
    """Run the sweep of ``workload`` with ``settings`` (a suite's keys; a list sweeps its key;
    ``args={"width": 16}`` are the factory's keyword arguments) and return the per-config
    table (a pandas DataFrame: config_id, status, throughput and its interval, step times,
    memory, mfu, ...). Raises gpubench.errors.InputError for bad settings or a model that
    cannot be built, before anything runs."""
    from rich.console import Console

    from gpubench.report.load import load_report_data
    from gpubench.runner.run import RunRequest, execute
    from gpubench.suite import suite_text

    all_settings = {"workload": workload, **settings}
    refs: list[str] = []
    for key in ("workload", "batches", "loss"):
        value = all_settings.get(key)
        refs += [str(v) for v in (value if isinstance(value, list) else [value]) if v]
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="gpubench-api-") as tmp:
        suite = Path(tmp) / f"{name}.toml"
        suite.write_text(suite_text(name, all_settings), encoding="utf-8")
        before = set(out.glob("*/run.json")) if out.is_dir() else set()
        code = execute(RunRequest(str(suite), out, repeats=repeats, report=report, code_path=_code_path(refs)),
                       Console(quiet=quiet))
    made = sorted(set(out.glob("*/run.json")) - before)
    if not made:
        raise InputError(f"gpubench.benchmark: the run wrote no run directory under {out} (exit {code})")
    data = load_report_data([made[-1].parent])
    return data.configs


def advise(workload: str, *, budget_s: float = 900.0, only: list[str] | None = None, skip: list[str] | None = None,
           alpha: float = 0.05, threshold: str = THRESHOLD, loss_tolerance: str = "10%", out: str | Path = "runs",
           name: str = "notebook", report: bool = False, quiet: bool = True, **settings: Any) -> Any:
    """``gpubench advise`` on ``workload`` with ``settings`` (one config: no lists), from a
    notebook: the practices that apply, each measured against the config in fresh worker
    processes within ``budget_s``, ranked. Returns the ranked table (a pandas DataFrame: practice,
    verdict, speedup and its interval, memory_ratio, cold_start_ms, payback_steps, loss_ratio,
    ...; the measured combination last, group ``combination``) with ``.attrs``: ``best`` (the
    best row, or None), ``best_lines`` (its suite lines), ``skipped`` (what does not apply, and
    why) and ``run_dir``. Raises gpubench.errors.InputError for bad settings, and RuntimeError
    when the config itself does not train."""
    import json

    import pandas as pd
    from rich.console import Console

    from gpubench.advise.command import ADVICE_JSON, AdviseRequest, execute_advise
    from gpubench.suite import suite_text

    listed = [k for k, v in settings.items() if isinstance(v, list)]
    if listed:
        raise InputError(f"gpubench.advise: {', '.join(listed)}: one value each (advise measures one config)")
    all_settings = {"workload": workload, **settings}
    refs = [str(all_settings[k]) for k in ("workload", "batches", "loss") if all_settings.get(k)]
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="gpubench-api-") as tmp:
        suite = Path(tmp) / f"{name}.toml"
        suite.write_text(suite_text(name, all_settings), encoding="utf-8")
        before = set(out.glob("*/run.json")) if out.is_dir() else set()
        code = execute_advise(AdviseRequest(str(suite), out=out, budget_s=budget_s, only=list(only or []),
                                            skip=list(skip or []), alpha=alpha, threshold=threshold,
                                            loss_tolerance=loss_tolerance, report=report,
                                            code_path=_code_path(refs)), Console(quiet=quiet))
    made = sorted(set(out.glob("*/run.json")) - before)
    if not made:
        raise InputError(f"gpubench.advise: the advise wrote no run directory under {out} (exit {code})")
    run_dir = made[-1].parent
    advice = json.loads((run_dir / ADVICE_JSON).read_text())
    if advice.get("baseline_failed"):
        raise RuntimeError(f"gpubench.advise: the config does not train: {advice['baseline_failed']} ({run_dir})")
    rows = advice["rows"] + ([advice["combination"]] if advice.get("combination") else [])
    frame = pd.DataFrame(rows)
    frame.attrs.update(best=advice.get("best"), best_lines=advice.get("best_lines") or [],
                       skipped=advice.get("skipped") or [], run_dir=str(run_dir))
    return frame


__all__ = ["advise", "benchmark"]
