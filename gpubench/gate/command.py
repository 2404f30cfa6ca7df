"""``gpubench compare`` and ``gpubench baseline``: load, check, compare, print, exit code."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from gpubench.errors import EXIT_OK, EXIT_REGRESSED, InputError, os_error_line, warn
from gpubench.gate import ALPHA, NOISE_FLOOR, THRESHOLD, render
from gpubench.gate.compare import compare, fingerprint_differences, gate_options
from gpubench.gate.sides import DEFAULT_BASELINES, Side, list_baselines, resolve, save_baseline
from gpubench.results.outputs import check_output_dir, check_output_file, write_output
from gpubench.results.store import json_text


@dataclass
class CompareRequest:
    baseline: str
    current: str
    threshold: str = THRESHOLD
    noise_floor: str = NOISE_FLOOR
    alpha: float = ALPHA
    metric: str = "throughput"
    markdown: Path | None = None
    json: Path | None = None
    force: bool = False
    baselines_dir: Path = DEFAULT_BASELINES
    correction: str = "bonferroni"
    junit: Path | None = None
    best_of: int = 1


def check_environments(base: Side, cur: Side, force: bool) -> None:
    frameworks = {r.framework for r in base.results + cur.results}
    diffs = fingerprint_differences(base.env, cur.env, frameworks)
    if diffs and not force:
        raise InputError(f"{base.label} and {cur.label} ran in different environments ({'; '.join(diffs)}); "
                         "comparing them measures the environment, not the change: use --force to compare anyway")
    for d in diffs:
        warn(f"environments differ (--force): {d}")


def lockstep_pair(base: Side, cur: Side) -> bool:
    """The two sides of one ``gpubench ab --lockstep``: their repeats ran in pairs, and are
    compared paired."""
    a, b = base.meta.get("args") or {}, cur.meta.get("args") or {}
    return bool(a.get("lockstep") and b.get("lockstep") and a.get("ab_id") and a.get("ab_id") == b.get("ab_id")
                and {a.get("ab_side"), b.get("ab_side")} == {"baseline", "candidate"})


def run_compare(req: CompareRequest, console: Console) -> int:
    """0: no regression, 1: a regression; bad input raises InputError (exit 2), with
    ``--junit`` still written (junit_on_bad_input)."""
    with junit_on_bad_input(req.junit, "compare"):
        return _compare(req, console)


def _compare(req: CompareRequest, console: Console) -> int:
    options = gate_options(req.threshold, req.noise_floor, req.alpha, req.metric, req.correction, req.best_of)
    check_output_file(req.markdown, "--markdown")
    check_output_file(req.json, "--json")
    check_output_file(req.junit, "--junit")
    base = resolve(req.baseline, req.baselines_dir)
    cur = resolve(req.current, req.baselines_dir)
    check_environments(base, cur, req.force)
    labels = (base.label, cur.label)
    result = compare(base.results, cur.results, options.metric, options.threshold, options.noise_floor, options.alpha,
                     labels, options.correction, paired=lockstep_pair(base, cur), best_of=options.best_of)
    reproduce = render.compare_command(req.baseline, req.current, options, req.force)
    power, triaged = render.show(console, result, labels, base.results, cur.results, reproduce)
    if req.markdown:  # a failed write is exit 2 with its message, after the verdicts above
        write_output(req.markdown, render.markdown(result, labels, power, triaged), "--markdown")
    if req.json:
        write_output(req.json, json_text({"baseline": str(base.path), "current": str(cur.path), **result.to_dict(),
                                          "triage": triaged}), "--json")
    if req.junit:
        write_output(req.junit, render.junit(result, labels, power, triaged), "--junit")
    return EXIT_REGRESSED if result.regressed else EXIT_OK


@contextmanager
def junit_on_bad_input(junit: Path | None, command: str) -> Iterator[None]:
    """``compare`` / ``ab`` with ``--junit FILE``: when the command ends as bad input (exit 2),
    FILE still gets a report, one failed test case holding the error line (render.junit_error),
    written atomically; the error itself goes on to the CLI's one line and exit 2. Where FILE
    itself cannot be written, there is only that line."""
    try:
        yield
    except (InputError, OSError) as e:
        if junit is not None:
            try:
                check_output_file(junit, "--junit")
                # the line the CLI prints: an OSError as its file and reason, without the errno
                line = str(e) if isinstance(e, InputError) else os_error_line(e)
                write_output(junit, render.junit_error(command, line), "--junit")
            except InputError:
                pass  # FILE cannot be written: the error raised (about FILE, or the first problem) is all
        raise


def run_baseline(action: str, run_dir: Path | None, name: str | None, baselines_dir: Path, force: bool,
                 console: Console) -> int:
    if action == "save":
        assert run_dir is not None and name is not None
        check_output_dir(baselines_dir, "--baselines-dir")
        target = save_baseline(run_dir, name, baselines_dir, force)
        console.print(f"saved baseline {name!r}: {target}", highlight=False)
        return EXIT_OK
    if baselines_dir.exists() and not baselines_dir.is_dir():
        raise InputError(f"--baselines-dir {baselines_dir}: not a directory")
    rows = list_baselines(baselines_dir)  # a missing directory: no baselines saved yet
    if not rows:
        console.print(f"no baselines in {baselines_dir}", highlight=False)
    for row in rows:
        console.print(json.dumps(row) if "problem" in row else
                      f"{row['name']}: run {row['run_id']} ({row['created_at']}), {row['configs']} configs, "
                      f"{row['repeats']} repeat(s)", highlight=False)
    return EXIT_OK
