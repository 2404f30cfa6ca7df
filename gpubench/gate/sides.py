"""What ``compare`` compares: run directories, or named baselines saved with ``baseline save``.

A baseline is a copy of a run's run.json and results.jsonl under ``.gpubench/baselines/NAME/``
(a directory users can commit), so later runs are compared against a fixed reference.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubench.errors import InputError
from gpubench.results.result import Result
from gpubench.results.store import RESULTS_FILE, RUN_FILE, load_results, load_run, run_env

DEFAULT_BASELINES = Path(".gpubench/baselines")
# a letter or digit first: never '.', '..' or a hidden name (which would reach outside the
# baselines directory, or collide with the temporary directories of save_baseline)
BASELINE_NAME = "[A-Za-z0-9][A-Za-z0-9_.-]*"


@dataclass
class Side:
    label: str
    path: Path
    meta: dict[str, Any]
    results: list[Result]

    @property
    def env(self) -> dict[str, Any]:
        return run_env(self.meta, self.results)


def _load(path: Path, label: str) -> Side:
    meta = load_run(path)
    results = load_results(path)
    if not results:
        raise InputError(f"{path / RESULTS_FILE}: no results to compare")
    return Side(label, path, meta, results)


def resolve(text: str, baselines_dir: Path | None) -> Side:
    """A run directory, or the name of a saved baseline (None: run directories only)."""
    path = Path(text)
    if path.is_dir():
        return _load(path, text)
    if baselines_dir is None:
        raise InputError(f"{text}: no such run directory")
    saved = baselines_dir / text
    if re.fullmatch(BASELINE_NAME, text) and saved.is_dir():
        return _load(saved, f"baseline {text}")
    names = ", ".join(b["name"] for b in list_baselines(baselines_dir)) or "none"
    raise InputError(f"{text}: no such run directory or saved baseline (saved in {baselines_dir}: {names})")


def save_baseline(run_dir: Path, name: str, baselines_dir: Path, force: bool = False) -> Path:
    """Copy a run into ``baselines_dir/name``; the old baseline of that name is removed only
    once the new copy is complete."""
    if not re.fullmatch(BASELINE_NAME, name):
        raise InputError(f"baseline name {name!r}: expected {BASELINE_NAME} (a letter or digit, then letters, "
                         "digits, '_', '.' or '-')")
    _load(run_dir, str(run_dir))  # validate before writing anything
    target = baselines_dir / name
    if target.exists() and not force:
        raise InputError(f"{target}: a baseline named {name!r} exists; use --force to replace it")
    baselines_dir.mkdir(parents=True, exist_ok=True)
    tmp = _remove_child(baselines_dir, f".{name}.tmp")
    tmp.mkdir()
    for f in (RUN_FILE, RESULTS_FILE):
        shutil.copy2(run_dir / f, tmp / f)
    old = _remove_child(baselines_dir, f".{name}.old")
    if target.exists() or target.is_symlink():
        target.rename(old)
    tmp.rename(target)
    _remove_child(baselines_dir, old.name)
    return target


def _remove_child(parent: Path, name: str) -> Path:
    """Remove ``parent/name`` if it exists, and return that path. The one place baselines are
    deleted: it refuses any name that is not a direct child of ``parent``."""
    path = parent / name
    if name in ("", ".", "..") or os.sep in name or "/" in name or path.parent != parent:
        raise AssertionError(f"refusing to remove {path}: not a direct child of {parent}")
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    return path


def list_baselines(baselines_dir: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for d in sorted(p for p in baselines_dir.glob("*") if p.is_dir() and not p.name.startswith(".")):
        try:
            meta = load_run(d)
            results = load_results(d)
        except InputError as e:
            out.append({"name": d.name, "problem": str(e)})
            continue
        out.append({"name": d.name, "run_id": meta.get("run_id"), "created_at": meta.get("created_at"),
                    "configs": len({r.config_id for r in results}),
                    "repeats": max((r.repeat for r in results), default=0) + 1})
    return out
