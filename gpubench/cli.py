"""Command line: each command's handler, which hands its options over to the module doing the
work (the parser, the examples and the exit codes are gpubench.commands')."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpubench.commands import build_parser, gate_fields, report_fields
from gpubench.errors import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    InputError,
    Stopped,
    error_line,
    os_error_line,
    stop_exit_code,
    stop_message,
    warn,
)
from gpubench.fmt import table_fits
from gpubench.launch import Interpreter
from gpubench.runner.launcher import LauncherChoice
from gpubench.runner.nodes import DEFAULT_MASTER_PORT, Nodes
from gpubench.runner.run import RunRequest


def _raise_stopped(signum: int, _frame: object) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second SIGTERM during the clean-up ends the process at once
    raise Stopped(signum)


def main(argv: list[str] | None = None) -> int:
    """Run one command. SIGTERM (``kill PID``, ``timeout``, a CI job cancelled, ``docker
    stop``) stops it as Ctrl-C does: the running worker is killed, finished results are kept,
    the message says how to resume, exit 143. SIGINT is left as gpubench found it: a
    non-interactive shell starts background jobs (``gpubench run ... &`` in a script) with
    SIGINT ignored, so that Ctrl-C at the terminal reaches only the foreground command, and
    gpubench keeps that (as Python itself does); such a run is stopped with ``kill PID``. An
    inherited ignored SIGTERM (``nohup``-style launchers) is kept ignored too."""
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        return _main(argv)
    finally:
        if previous is signal.SIG_DFL:  # main() called in-process (tests) leaves no handler behind
            signal.signal(signal.SIGTERM, previous)


def launcher_choice(args: argparse.Namespace) -> LauncherChoice | None:
    """--launcher's choice with its options (None: local, the default); the Slurm options without
    --launcher slurm are an error naming them. ``--nnodes`` (run's) is under Slurm the nodes each
    distributed config's job spans."""
    from gpubench.runner.slurm import SlurmOptions

    given = [f"--{k.replace('_', '-')}" for k in ("partition", "account", "time", "gpus_per_node", "max_parallel")
             if getattr(args, k) is not None] + (["--sbatch-arg"] if args.sbatch_args else [])
    if args.launcher != "slurm":
        if given:
            raise InputError(f"{', '.join(given)}: Slurm options need --launcher slurm")
        return None
    by_hand = [f"--{k.replace('_', '-')}" for k, default in (("node_rank", 0), ("master_addr", None),
                                                             ("master_port", DEFAULT_MASTER_PORT))
               if getattr(args, k, default) != default]
    if by_hand:
        raise InputError(f"{', '.join(by_hand)}: not with --launcher slurm (Slurm places the nodes; give --nnodes N "
                         "for distributed configs spanning N nodes)")
    nnodes = getattr(args, "nnodes", 1)
    if nnodes < 1:
        raise InputError(f"--nnodes: expected an integer >= 1, got {nnodes}")
    return SlurmOptions(partition=args.partition, account=args.account, time=args.time,
                        gpus_per_node=args.gpus_per_node, max_parallel=args.max_parallel or 0, nodes=nnodes,
                        sbatch_args=tuple(args.sbatch_args))


Handler = Callable[[argparse.Namespace, Console], int]


def _run(args: argparse.Namespace, console: Console) -> int:
    from gpubench.history.db import ENV_VAR
    from gpubench.provenance import parse_tags
    from gpubench.runner.cost import parse_prices
    from gpubench.runner.run import execute

    sets = args.sets + ([] if args.telemetry_interval_ms is None
                        else [f"telemetry_interval_ms={args.telemetry_interval_ms}"])
    choice = launcher_choice(args)  # under Slurm, --nnodes is the nodes each distributed job spans
    nodes = Nodes() if choice else Nodes(args.nnodes, args.node_rank, args.master_addr, args.master_port)
    return execute(RunRequest(suite=args.suite, out=args.out, sets=sets, repeats=args.repeats, resume=args.resume,
                              **report_fields(args), calibrate=not args.no_calibrate, nodes=nodes,
                              db=args.db or os.environ.get(ENV_VAR) or None, tags=parse_tags(args.tags),
                              launcher=choice, max_jobs=args.max_jobs, retry_failed=args.retry_failed,
                              require_idle_gpu=args.require_idle_gpu,
                              prices=parse_prices(args.price) if args.price is not None else None), console)


def _history(args: argparse.Namespace, console: Console) -> int:
    from gpubench.history.db import require_history
    from gpubench.provenance import parse_tags

    require_history()
    from gpubench.gate.compare import gate_options, parse_fraction
    from gpubench.history.changes import CheckOptions
    from gpubench.history.command import HistoryRequest, check_options, noise_options, run_history
    from gpubench.history.noise import NoiseOptions
    from gpubench.history.query import Filters

    filters = Filters(*(getattr(args, k, None) for k in ("suite", "config", "machine", "branch", "since")))
    check = CheckOptions()
    if args.action in ("report", "check"):
        check = check_options(args.p_value, args.permutations, args.min_size,
                              parse_fraction(args.threshold, "--threshold"), args.recent, args.last, args.together)
    noise = NoiseOptions()
    if args.action == "noise":
        gate = gate_options(args.threshold, args.noise_floor, args.alpha, "throughput")
        noise = noise_options(args.repeats, args.alpha, args.configs, gate.threshold, gate.noise_floor, args.effect)

    def bisect(good: str, bad: str) -> int:
        """``history check --bisect SUITE``: gpubench bisect of SUITE between two commits."""
        from gpubench.bisect.command import BisectRequest, execute_bisect

        return execute_bisect(BisectRequest(suite=args.bisect, good=good, bad=bad, repo=args.repo,
                                            sets=args.bisect_sets, budget_s=args.bisect_budget), console)

    return run_history(HistoryRequest(
        action=args.action, db=args.db, run_dirs=getattr(args, "run_dirs", []),
        tags=parse_tags(getattr(args, "tags", [])), filters=filters, metrics=getattr(args, "metrics", []),
        out=getattr(args, "out", None), pinned=getattr(args, "pinned", []), check=check,
        json=getattr(args, "json", None), changes=not getattr(args, "no_changes", False), noise=noise,
        bisect=bisect if getattr(args, "bisect", None) else None), console)


def _report(args: argparse.Namespace, console: Console) -> int:
    from gpubench.report.build import build_report

    report = build_report(args.run_dirs, args.out)
    for warning in report.warnings:
        warn(warning)
    console.print(f"report: {report.index}\n  charts: {len(report.charts)} PNG in {report.index.parent / 'charts'}"
                  f"\n  csv: {report.csv}\n  markdown: {report.markdown}", highlight=False)
    return EXIT_OK


def _compare(args: argparse.Namespace, console: Console) -> int:
    from gpubench.gate.command import CompareRequest, run_compare

    return run_compare(CompareRequest(baseline=args.baseline, current=args.current, **gate_fields(args),
                                      force=args.force, baselines_dir=args.baselines_dir, best_of=args.best_of),
                       console)


def _ab(args: argparse.Namespace, console: Console) -> int:
    from gpubench.gate.command import junit_on_bad_input
    from gpubench.runner.ab import ABRequest, execute_ab

    with junit_on_bad_input(args.junit, "ab"):  # bad input (exit 2) still writes --junit
        return execute_ab(ABRequest(
            suite=args.suite, baseline=_baseline_side(args, console),
            candidate=Interpreter(args.candidate_python, args.candidate_path), out=args.out, sets=args.sets,
            repeats=args.repeats, **gate_fields(args), **report_fields(args), lockstep=args.lockstep,
            budget_s=args.budget, best_of=args.best_of, prior=args.prior, launcher=launcher_choice(args)), console)


def _baseline_side(args: argparse.Namespace, console: Console) -> Interpreter:
    """ab's baseline side: --baseline-python and --baseline-path, or --baseline-ref's commit (the
    merge base of HEAD with it) in a cached worktree, made as gpubench bisect makes its commits'."""
    if args.baseline_ref is None:
        return Interpreter(args.baseline_python, args.baseline_path)
    if args.baseline_path is not None or args.baseline_python != sys.executable:
        raise InputError(f"--baseline-ref {args.baseline_ref}: not with --baseline-path or --baseline-python (the "
                         "baseline is that commit's worktree, with the --setup environment)")
    from gpubench.bisect import git

    repo = git.toplevel(Path("."), "--baseline-ref (the working directory)")
    ref = git.resolve(repo, args.baseline_ref, "--baseline-ref")
    base = git.git(repo, "merge-base", git.resolve(repo, "HEAD", "--baseline-ref (HEAD)"), ref)
    cache = args.cache if args.cache.is_absolute() else Path.cwd() / args.cache
    side = git.checkout(repo, base, cache, args.setup, cache / "setup.log")
    console.print(f"baseline: {base[:12]} ({'the merge base of HEAD and ' if base != ref else ''}"
                  f"{args.baseline_ref}: {git.git(repo, 'show', '-s', '--format=%s', base)}), in {side.pythonpath}",
                  highlight=False, markup=False)
    return side


def _find_batch(args: argparse.Namespace, console: Console) -> int:
    from gpubench.runner.find_batch_command import FindBatchRequest, run_find_batch

    return run_find_batch(FindBatchRequest(args.suite, args.sets, args.limit, args.json, args.out,
                                           launcher_choice(args)), console)


def _bisect(args: argparse.Namespace, console: Console) -> int:
    from gpubench.bisect.command import BisectRequest, execute_bisect

    if args.resume is None and not (args.suite and args.good and args.bad):
        raise InputError("gpubench bisect: give a suite, --good REV and --bad REV (or --resume DIR)")
    return execute_bisect(BisectRequest(
        suite=args.suite, good=args.good, bad=args.bad, repo=args.repo, sets=args.sets, out=args.out,
        cache=args.cache, repeats=args.repeats, budget_s=args.budget, threshold=args.threshold,
        noise_floor=args.noise_floor, alpha=args.alpha, setup=args.setup, markdown=args.markdown,
        json=args.json, resume=args.resume), console)


def _advise(args: argparse.Namespace, console: Console) -> int:
    from gpubench.advise.command import AdviseRequest, execute_advise

    if not args.suite and args.resume is None:
        raise InputError("gpubench advise: give a suite (or --resume DIR)")
    return execute_advise(AdviseRequest(
        suite=args.suite, sets=args.sets, out=args.out, budget_s=args.budget, alpha=args.alpha,
        threshold=args.threshold, noise_floor=args.noise_floor, loss_tolerance=args.loss_tolerance,
        only=args.only, skip=args.skip, markdown=args.markdown, json=args.json, **report_fields(args),
        resume=args.resume, launcher=launcher_choice(args)), console)


def _profile(args: argparse.Namespace, console: Console) -> int:
    from gpubench.profile.command import ProfileRequest, execute_profile

    return execute_profile(ProfileRequest(suite=args.suite, out=args.out, sets=args.sets, steps=args.steps,
                                          **report_fields(args), memory_history=args.memory_history,
                                          launcher=launcher_choice(args)), console)


def _calibrate(args: argparse.Namespace, console: Console) -> int:
    from gpubench.calibrate.command import run_calibrate

    return run_calibrate(args.devices, args.force, args.json, console)


def _export(args: argparse.Namespace, console: Console) -> int:
    from gpubench.gate.export import run_export

    return run_export(args.run_dir, args.format, args.out)


def _baseline(args: argparse.Namespace, console: Console) -> int:
    from gpubench.gate.command import run_baseline

    return run_baseline(args.action, getattr(args, "run_dir", None), getattr(args, "name", None),
                        args.baselines_dir, getattr(args, "force", False), console)


def _list(args: argparse.Namespace, console: Console) -> int:
    from gpubench.inventory import show_list

    show_list(console, args.suites_dir)
    return EXIT_OK


def _env(args: argparse.Namespace, console: Console) -> int:
    from gpubench.inventory import show_env

    show_env(console, args.json)
    return EXIT_OK


# each command's handler, by the command's name (gpubench.commands.build_parser has the same names)
HANDLERS: dict[str, Handler] = {
    "run": _run, "history": _history, "report": _report, "compare": _compare, "ab": _ab,
    "find-batch": _find_batch, "bisect": _bisect, "advise": _advise, "profile": _profile, "calibrate": _calibrate,
    "export": _export, "baseline": _baseline, "list": _list, "env": _env,
}


class Terminal(Console):
    """The console every command prints to. Its width is the terminal's, or ``COLUMNS`` where
    that is set (piped or not); piped without ``COLUMNS``, 160 (CI logs: config ids unwrapped);
    a terminal that reports no width (0) is taken as 80. A line of text is printed whole, for
    the terminal to wrap (a path is never cut in two or broken across lines); a table is laid out
    to the width, and one too wide for it (fmt.table_fits: every cell that does not wrap in full)
    is printed as records, one ``header: value`` a line and a blank line between rows, instead of
    columns of ellipses."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("soft_wrap", True)
        super().__init__(**kwargs)
        columns = os.environ.get("COLUMNS", "")
        if "width" not in kwargs and not (columns.isdigit() and int(columns) > 0):
            if not self.is_terminal:
                self.width = 160
            elif self.width < 1:
                self.width = 80

    def print(self, *objects: Any, **kwargs: Any) -> None:
        shown = (records(o) if isinstance(o, Table) and not table_fits(self, o) else o for o in objects)
        super().print(*shown, **kwargs)



def records(table: Table) -> Text:
    """A table as records: its title, then each row as ``header: value`` lines (empty cells left
    out), then its caption; long values fold rather than being cut."""
    def plain(cell: Any) -> str:
        return Text.from_markup(cell).plain if isinstance(cell, str) else getattr(cell, "plain", str(cell))

    lines = [plain(table.title)] if table.title else []
    headers = [plain(c.header) for c in table.columns]
    for row in zip(*(list(c.cells) for c in table.columns), strict=True):
        lines += ["", *(f"{h}: {v}" for h, cell in zip(headers, row, strict=True) if (v := plain(cell)))]
    if table.caption:
        lines += ["", plain(table.caption)]
    return Text("\n".join(lines), overflow="fold")


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    console = Terminal()
    try:
        from gpubench.plugins import load_plugins

        load_plugins()
        return HANDLERS[args.command](args, console)
    except InputError as e:
        print(error_line(e), file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:  # a path that cannot be read or written and was not checked first: one line
        print(error_line(os_error_line(e)), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Stopped)
        stop_message(e)
        return stop_exit_code(e)
