"""The command line's commands and options: the parser, each command's examples and exit codes
(its --help, and docs/reference/cli.md through gpubench.docgen). The options several commands
share (the suite and --set, the gate's, the launcher's) are declared once here; the names an
option lists come from the registries."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from gpubench import __version__
from gpubench.advise.practices import GROUPS
from gpubench.errors import EXIT_BAD_INPUT, did_you_mean, printable
from gpubench.gate import ALPHA, NOISE_FLOOR, THRESHOLD
from gpubench.gate.compare import CORRECTIONS
from gpubench.gate.export import FORMATS
from gpubench.results.metrics import gate_metric_names
from gpubench.runner.find_batch_command import DEFAULT_LIMIT
from gpubench.runner.nodes import DEFAULT_MASTER_PORT
from gpubench.runner.session import LAUNCHERS
from gpubench.suite import MAX_JOBS, MAX_PLANNED

# what add_subparsers returns: each command's _add_<command> adds its parser to it
Subcommands = argparse._SubParsersAction  # noqa: SLF001 - argparse names no public type for it
METRIC_HELP = f"the metric to gate on, one of: {', '.join(gate_metric_names())} (default throughput)"


def _duration(text: str) -> float:
    """``600``, ``600s``, ``10m``, ``1h`` -> seconds (argparse type)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a time such as 600, 600s or 10m")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _report_dir(text: str) -> Path:
    """--report-dir: a directory, or one that can be made, where files can be created; checked
    before anything runs (a report that cannot be written is found out at the start, not the end)."""
    from gpubench.errors import InputError
    from gpubench.results.outputs import check_output_dir

    try:
        check_output_dir(Path(text), "--report-dir")
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--report-dir ")) from None
    return Path(text)


def _max_jobs(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_PLANNED:
        raise argparse.ArgumentTypeError(f"at most {MAX_PLANNED:,} (planning holds every config in memory, about 4 KB "
                                         f"each), got {value:,}")
    return value


class OneLineParser(argparse.ArgumentParser):
    """Usage errors in one line on stderr, exit 2: what is wrong and where the usage is (the
    usage block argparse prints first buries the error in CI logs). Sub-command parsers are of
    this class too (add_subparsers makes its parsers of the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, printable(f"{self.prog}: error: {message}{self._typo(message)} (see {self.prog} "
                                            "--help)") + "\n")

    def _typo(self, message: str) -> str:
        """``; did you mean run?`` for a misspelt command or choice, or option."""
        if m := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message):
            return did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        if m := re.match(r"unrecognized arguments: (--?[\w-]+)", message):  # any command's option
            return did_you_mean(m.group(1), [o for _, p in iter_commands(self) for a in p._actions
                                             for o in a.option_strings if o.startswith("--")])
        return ""


# two or three examples at the end of each command's --help (keyed by the command's words after
# "gpubench"; "" is gpubench --help itself)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "": ("gpubench run suites/quick.toml                      # train the quick suite, write the report",
         "gpubench compare runs/main-run runs/my-branch-run   # did my branch make training slower?",
         "gpubench run --help                                 # a command's options and examples"),
    "run": ("gpubench run suites/quick.toml",
            "gpubench run suites/frameworks.toml --set device=cuda --set batch_size=256,1024 --repeats 3",
            "gpubench run suites/parallel.toml --launcher slurm --nnodes 2 --partition gpu --out /shared/runs"),
    "report": ("gpubench report runs/quick-20261125-101500",
               "gpubench report runs/before runs/after --out reports/before-after   # side by side"),
    "compare": ("gpubench compare runs/baseline runs/candidate",
                "gpubench compare main runs/candidate --threshold 5% --markdown summary.md   # a saved baseline",
                "gpubench compare runs/baseline runs/candidate --metric peak_memory_bytes"),
    "ab": ("gpubench ab suites/quick.toml --set device=cpu --baseline-python ../main/.venv/bin/python "
           "--candidate-python .venv/bin/python --repeats 12",
           "gpubench ab suites/quick.toml --set workload=mlp --set device=cpu --set batch_size=256 "
           "--baseline-python py-a --candidate-python py-b --lockstep --repeats 12 --budget 9m --junit ab.xml"),
    "export": ("gpubench export runs/quick-20261125-101500 --format pytest-benchmark --out bench.json",
               "gpubench export runs/quick-20261125-101500 --format github-action --out action.json"),
    "baseline": ("gpubench baseline save runs/quick-20261125-101500 main",
                 "gpubench baseline list"),
    "baseline save": ("gpubench baseline save runs/quick-20261125-101500 main",
                      "gpubench baseline save runs/quick-20261126-090000 main --force   # replace it"),
    "baseline list": ("gpubench baseline list", "gpubench baseline list --baselines-dir ci/baselines"),
    "list": ("gpubench list", "gpubench list --suites-dir my-suites"),
    "find-batch": ("gpubench find-batch suites/quick.toml --set device=cuda",
                   "gpubench find-batch suites/resnet.toml --set device=cuda --limit 4096 --json batches.json"),
    "advise": ("gpubench advise suites/quick.toml --set workload=mlp --set framework=torch --set device=cpu",
               "gpubench advise my_suite.toml --set device=cuda --budget 20m --skip compile --markdown advice.md",
               "gpubench advise --resume runs/mymodel-advise-20261127-101500-3f2a9c"),
    "bisect": ("gpubench bisect suite.toml --good v1.4 --bad main --set device=cuda",
               "gpubench bisect suites/quick.toml --set workload=mlp --set device=cpu --set batch_size=256 "
               "--good HEAD~16 --bad HEAD --budget 5m --markdown bisect.md",
               "gpubench bisect --resume runs/bisect-1a2b3c4d-5e6f7a8b-20261127-101500"),
    "profile": ("gpubench profile suites/quick.toml --set workload=cnn --set framework=torch",
                "gpubench profile suites/quick.toml --set device=cuda --steps 10"),
    "calibrate": ("gpubench calibrate", "gpubench calibrate --device cuda --force   # measure again"),
    "history": ("gpubench history ingest runs/* --db history.db",
                "gpubench history check --db history.db",
                "gpubench history report --db history.db --out reports/history"),
    "history ingest": ("gpubench history ingest runs/* --db history.db --tag branch=main",
                       "gpubench history ingest runs/quick-20261125-101500 --db postgresql://bench@db/gpubench"),
    "history list": ("gpubench history list --db history.db", "gpubench history list --suite quick --since 2026-11-01"),
    "history show": ("gpubench history show --db history.db --config cnn-torch",
                     "gpubench history show --config cnn-torch --metric throughput --metric peak_memory_bytes"),
    "history export": ("gpubench history export --db history.db --out history.csv",
                       "gpubench history export --suite quick --out quick.json"),
    "history report": ("gpubench history report --db history.db --out reports/history",
                       "gpubench history report --suite quick --pin cnn-torch-cpu --out reports/history"),
    "history check": ("gpubench history check --db history.db",
                      "gpubench history check --suite quick --threshold 5% --json changes.json"),
    "history noise": ("gpubench history noise --db history.db",
                      "gpubench history noise --suite quick --effect 5% --json noise.json"),
    "env": ("gpubench env", "gpubench env --json"),
}


# each command's exit codes, at the end of its --help (and so in docs/reference/cli.md): every
# command has 2 for bad input (one line naming what was wrong; nothing written), and those that
# measure 130 (Ctrl-C) and 143 (SIGTERM): the finished measurements kept, a line saying how to go on
BAD_INPUT = "2 bad input: one line naming what was wrong and what is allowed; nothing written"
STOPPED = "130 Ctrl-C, 143 SIGTERM: what finished is kept, and a line says how to go on"
MEASURED = "1 a config ended error or timeout, or nothing was measured (all unavailable, unsupported...)"
EXIT_CODES: dict[str, tuple[str, ...]] = {
    "run": ("0 every config that could run was measured", MEASURED, BAD_INPUT, STOPPED),
    "report": ("0 the report written (a run with nothing measured too: its failures)", BAD_INPUT),
    "compare": ("0 no config regressed", "1 a config regressed", BAD_INPUT),
    "ab": ("0 no config regressed", "1 a config regressed, or a repeat of a side failed", BAD_INPUT, STOPPED),
    "export": ("0 written", BAD_INPUT),
    "baseline save": ("0 saved", BAD_INPUT),
    "baseline list": ("0 listed", BAD_INPUT),
    "list": ("0 listed", BAD_INPUT),
    "find-batch": ("0 every search ended at an oom or the limit",
                   "1 a search stopped on another status (the config unavailable, failed...)", BAD_INPUT, STOPPED),
    "advise": ("0 the practices measured, whatever they did", "1 the baseline itself does not train", BAD_INPUT,
               STOPPED),
    "bisect": ("0 a commit named", "1 none named (not reproduced at the ends, or a step that stayed inconclusive)",
               BAD_INPUT, STOPPED),
    "profile": ("0 every config that could run was profiled", "1 a config ended error or timeout, its profiler "
                "failed, or nothing was profiled", BAD_INPUT, STOPPED),
    "calibrate": ("0 measured", "1 a measurement failed", BAD_INPUT, STOPPED),
    "history ingest": ("0 recorded", BAD_INPUT),
    "history list": ("0 listed", BAD_INPUT),
    "history show": ("0 shown", BAD_INPUT),
    "history export": ("0 written", BAD_INPUT),
    "history report": ("0 written", BAD_INPUT),
    "history check": ("0 no recent regression", "1 a regression among the --recent commits (with --bisect: or no "
                      "commit named)", BAD_INPUT),
    "history noise": ("0 measured", BAD_INPUT),
    "env": ("0 printed", BAD_INPUT),
}


def iter_commands(parser: argparse.ArgumentParser, words: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """The parser and every sub-command's, depth first, in the order they were added, each with
    its words after ``gpubench`` (``""`` for the top level, ``"history list"``)."""
    yield words, parser
    for action in parser._actions:  # argparse keeps sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from iter_commands(sub, f"{words} {name}".strip())


def _add_examples(parser: argparse.ArgumentParser) -> None:
    """Each command's examples and exit codes as its --help epilog (kept as written: one per line)."""
    for words, command in iter_commands(parser):
        parts = [f"{title}:\n" + "\n".join(f"  {line}" for line in lines)
                 for title, lines in (("examples", EXAMPLES.get(words)), ("exit codes", EXIT_CODES.get(words)))
                 if lines]
        if parts:
            command.epilog = "\n\n".join(parts)
            command.formatter_class = argparse.RawDescriptionHelpFormatter


# the gate's options, declared once for every command that gates (compare, ab): the dest of each
# is the field of the command's request it fills (gate_fields)
GATE_FIELDS = ("threshold", "noise_floor", "alpha", "correction", "metric", "markdown", "json", "junit")


def _add_gate_statistics(parser: argparse.ArgumentParser, figures_only: bool = False) -> None:
    """--threshold, --noise-floor and --alpha; ``figures_only`` where a command computes with the
    gate's figures rather than gating (history noise)."""
    threshold, noise_floor, alpha = (
        ("the gate's threshold", "the gate's noise floor", "the gate's alpha") if figures_only else
        ("slowdown that matters, from 0%% to below 100%%, e.g. 3%%",
         "changes inside this are noise, from 0%% up to the threshold",
         "error rate over the configs compared, as --correction says"))
    parser.add_argument("--threshold", default=THRESHOLD, help=f"{threshold} (default {THRESHOLD}%)")
    parser.add_argument("--noise-floor", default=NOISE_FLOOR, help=f"{noise_floor} (default {NOISE_FLOOR}%)")
    parser.add_argument("--alpha", type=float, default=ALPHA, help=f"{alpha} (default {ALPHA})")


def _add_gate_options(parser: argparse.ArgumentParser, json_help: str) -> None:
    """The options of a command that gives verdicts: its statistics, the metric, and the reports
    it writes (GATE_FIELDS)."""
    _add_gate_statistics(parser)
    parser.add_argument("--correction", choices=CORRECTIONS, default=CORRECTIONS[0],
                        help="bonferroni: alpha bounds the chance of any false regressed verdict (default); bh: "
                             "Benjamini-Hochberg, alpha bounds the expected share of false ones (more power on a "
                             "sweep)")
    parser.add_argument("--metric", default="throughput", help=METRIC_HELP)
    parser.add_argument("--markdown", type=Path, metavar="FILE", help="write a markdown summary (CI job summary)")
    parser.add_argument("--json", type=Path, metavar="FILE", help=json_help)
    parser.add_argument("--junit", type=Path, metavar="FILE",
                        help="write the verdicts as a JUnit XML test report (a config per test case; regressed fails)")


def gate_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The gate's options as a request's keyword arguments."""
    return {name: getattr(args, name) for name in GATE_FIELDS}


def report_fields(args: argparse.Namespace) -> dict[str, Any]:
    """--no-report and --report-dir (add_suite_options) as a request's keyword arguments."""
    return {"report": not args.no_report, "report_dir": args.report_dir}


def add_launcher_options(parser: argparse.ArgumentParser) -> None:
    """--launcher (the names from gpubench.runner.session.LAUNCHERS) and the Slurm launcher's
    options, for every command that measures."""
    slurm = parser.add_argument_group("launcher (--launcher slurm: every job a Slurm batch job)")
    slurm.add_argument("--launcher", choices=list(LAUNCHERS), default="local",
                       help="local: each job a process here (default); slurm: each a Slurm batch job, on a shared "
                            "--out")
    slurm.add_argument("--partition", help="sbatch --partition")
    slurm.add_argument("--account", help="sbatch --account")
    slurm.add_argument("--time", metavar="LIMIT", help="sbatch --time for every job (default: each config's "
                                                       "timeout_s, in whole minutes)")
    slurm.add_argument("--gpus-per-node", type=_positive_int, metavar="N",
                       help="sbatch --gpus-per-node for every job (default: the GPUs each CUDA config uses)")
    slurm.add_argument("--max-parallel", type=_positive_int, metavar="K", help="at most K jobs queued or running")
    slurm.add_argument("--sbatch-arg", dest="sbatch_args", action="append", default=[], metavar="ARG",
                       help="passed to sbatch as an #SBATCH line, e.g. --sbatch-arg=--qos=high or "
                            "--sbatch-arg=--nodelist=gpu7 (repeatable)")


SET_HELP = "override or narrow a matrix axis or a default, e.g. --set batch_size=64 (repeatable)"


def add_suite_options(parser: argparse.ArgumentParser, out_help: str = "where run directories go (default: runs)",
                      report: bool = True) -> None:
    """--set, --out and (``report``) --no-report, for every command that runs a suite."""
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=V1[,V2...]", help=SET_HELP)
    parser.add_argument("--out", type=Path, default=Path("runs"), help=out_help)
    if report:
        parser.add_argument("--no-report", action="store_true", help="do not write the HTML/CSV/markdown report")
        parser.add_argument("--report-dir", type=_report_dir, metavar="DIR",
                            help="where the report goes (default: reports/<run directory's name> beside the --out "
                                 "directory: reports/ for runs/)")


def _add_run(sub: Subcommands) -> None:
    run = sub.add_parser("run", help="run a suite: one isolated process per config")
    run.add_argument("suite", nargs="?", help="suite file, or a name in suites/ (optional with --resume)")
    add_suite_options(run)
    run.add_argument("--repeats", type=_positive_int, metavar="N",
                     help="run each config N times, each in a fresh process (default 1)")
    run.add_argument("--telemetry-interval-ms", type=int, metavar="MS",
                     help="telemetry sampling interval (default: the suite's [telemetry] interval_ms, else 100; "
                          "0 = off); the same as --set telemetry_interval_ms=MS")
    run.add_argument("--resume", type=Path, metavar="RUN_DIR", help="complete an interrupted run")
    run.add_argument("--retry-failed", action="store_true",
                     help="with --resume: run the config repeats that ended error or timeout again (their results "
                          "move to RUN_DIR/superseded.jsonl)")
    run.add_argument("--max-jobs", type=_max_jobs, metavar="N",
                     help=f"refuse a sweep of more than N config repeats (configs x repeats), checked before anything "
                          f"is expanded (default {MAX_JOBS:,}; at most {MAX_PLANNED:,}: planning holds every config in "
                          "memory)")
    run.add_argument("--require-idle-gpu", action="store_true",
                     help="refuse to measure (exit 2, the processes listed) when another process uses a GPU the "
                          "sweep's CUDA configs train on; without it each finding of the clean-machine check is a "
                          "warning")
    run.add_argument("--no-calibrate", action="store_true",
                     help="no device peaks (results get achieved_tflops but no mfu); by default they come from the "
                          "calibration cache, measured once per machine when missing (see gpubench calibrate)")
    run.add_argument("--price", metavar="PRICE|FILE",
                     help="what training cost: a price per device-hour (a GPU; for CPU configs, the machine), or a "
                          "TOML file of prices by device model as results name it (\"NVIDIA H100 80GB HBM3\" = 2.49), "
                          "with cuda and cpu for any other; each result gets metrics.cost (per million samples or "
                          "tokens at its steady rate, and the config repeat's whole time), in your currency; a "
                          "--resume goes on at the run's own prices")
    run.add_argument("--db", metavar="URL", help="also record each result into this results history as it finishes: "
                                                 "a file path, sqlite:///PATH or postgresql://USER@HOST/NAME (default "
                                                 "without --db: no history; GPUBENCH_DB names one for every run)")
    run.add_argument("--tag", dest="tags", action="append", default=[], metavar="KEY=VALUE",
                     help="a label kept with the run in run.json and the history (repeatable)")
    run.add_argument("--nnodes", type=int, default=1, metavar="N",
                     help="multi-node run: distributed configs run N x their processes, on N nodes (default 1); "
                          "by hand: start the same command on every node with --node-rank; with --launcher slurm: "
                          "each such config is one job on N nodes")
    run.add_argument("--node-rank", type=int, default=0, metavar="R", help="this node's rank, 0..N-1 (node 0 "
                                                                           "writes the results)")
    run.add_argument("--master-addr", metavar="HOST", help="node 0's address, reachable from every node")
    run.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT, metavar="P",
                     help=f"the rendezvous port on node 0 (default {DEFAULT_MASTER_PORT})")
    add_launcher_options(run)


def _add_report(sub: Subcommands) -> None:
    rep = sub.add_parser("report", help="HTML (self-contained), PNG charts, CSV and markdown from run directories")
    rep.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                     help="one run, or several to put side by side")
    rep.add_argument("--out", type=Path, help="output directory (default: reports/<run_id>)")


def _add_compare(sub: Subcommands) -> None:
    cmp = sub.add_parser("compare", help="regression gate: compare a run against a baseline, config by config")
    cmp.add_argument("baseline", help="run directory or saved baseline name")
    cmp.add_argument("current", help="run directory or saved baseline name")
    _add_gate_options(cmp, json_help="write the verdicts as JSON")
    cmp.add_argument("--best-of", type=_positive_int, default=1, metavar="K",
                     help="paired rounds (the two run directories of one ab --lockstep): each side's best of K "
                          "consecutive rounds makes one pair (default 1)")
    cmp.add_argument("--force", action="store_true", help="compare even if the environments differ")
    cmp.add_argument("--baselines-dir", type=Path, default=Path(".gpubench/baselines"))


def add_worktree_options(parser: argparse.ArgumentParser) -> None:
    """Where a commit's worktree and environment come from (bisect, ab --baseline-ref: one cache)."""
    parser.add_argument("--cache", type=Path, default=Path(".gpubench") / "worktrees", metavar="DIR",
                        help="where each commit's worktree (and --setup environment) is kept and reused "
                             "(default .gpubench/worktrees)")
    parser.add_argument("--setup", default="", metavar="CMD",
                        help="make an environment per worktree with this command (e.g. 'pip install -e .'), run once "
                             "per hash of the dependency files; default: this interpreter, the worktree first on the "
                             "path")


def _add_ab(sub: Subcommands) -> None:
    ab = sub.add_parser("ab", help="same-job A/B: each config alternately under two environments, then compare")
    ab.add_argument("suite", help="suite file, or a name in suites/")
    add_suite_options(ab, "where the A/B's directory (its two sides) goes (default: runs)")
    ab.add_argument("--baseline-python", default=sys.executable, metavar="PY",
                    help="interpreter of the baseline environment (default: this one)")
    ab.add_argument("--candidate-python", default=sys.executable, metavar="PY",
                    help="interpreter of the candidate environment (default: this one)")
    ab.add_argument("--baseline-path", metavar="DIR",
                    help="the baseline's checkout: of gpubench (the side imports that gpubench), or of your project "
                         "(the side imports your model code from it, and the suite's factories from its copy of the "
                         "suite's directory)")
    ab.add_argument("--candidate-path", metavar="DIR",
                    help="the candidate's checkout, as --baseline-path (default: the working directory's code)")
    ab.add_argument("--baseline-ref", metavar="REV",
                    help="the baseline is the commit this branch forked from: the merge base of HEAD with REV (REV "
                         "itself where it is an ancestor of HEAD), checked out in a cached worktree (--cache, "
                         "--setup) as gpubench bisect does; instead of --baseline-path and --baseline-python")
    add_worktree_options(ab)
    ab.add_argument("--repeats", type=_positive_int, default=10, metavar="N", help="repeats per side (default 10)")
    _add_gate_options(ab, json_help="write the verdicts (and any failed repeats) as JSON")
    ab.add_argument("--lockstep", action="store_true",
                    help="run the two sides of each round at once, taking turns window by window, and compare the "
                         "rounds paired (the gate for a noisy machine; one process a side, not for distributed "
                         "configs)")
    ab.add_argument("--budget", type=_duration, metavar="TIME",
                    help="sequential: after the --repeats rounds, run more rounds of the undecided configs (doubling) "
                         "until each is decided or this time (600, 600s, 10m) is spent; each look tests at alpha/2^k, "
                         "so the false-alarm rate stays within alpha")
    ab.add_argument("--best-of", type=_positive_int, default=1, metavar="K",
                    help="with --lockstep: each side's best of K consecutive rounds makes one pair, so that a worker "
                         "that was slow for its whole life does not decide a pair (default 1)")
    ab.add_argument("--continue", dest="prior", type=Path, metavar="AB_JSON",
                    help="go on with an A/B that ended undecided (the --json of an ab --lockstep --budget of the same "
                         "sides, suite and --set): its rounds are pooled with the new ones and its looks counted on, "
                         "so the two together keep the false-alarm rate within alpha")
    add_launcher_options(ab)


def _add_export(sub: Subcommands) -> None:
    exp = sub.add_parser("export", help="a run's results as pytest-benchmark JSON or GitHub benchmark-action JSON")
    exp.add_argument("run_dir", type=Path)
    exp.add_argument("--format", required=True, choices=FORMATS)
    exp.add_argument("--out", type=Path, metavar="FILE", help="default: stdout")


def _add_baseline(sub: Subcommands) -> None:
    base = sub.add_parser("baseline", help="save or list named baselines")
    base_sub = base.add_subparsers(dest="action", required=True)
    save = base_sub.add_parser("save", help="save RUN_DIR as baseline NAME")
    save.add_argument("run_dir", type=Path)
    save.add_argument("name")
    save.add_argument("--force", action="store_true", help="replace an existing baseline of that name")
    save.add_argument("--baselines-dir", type=Path, default=Path(".gpubench/baselines"))
    blist = base_sub.add_parser("list", help="list saved baselines")
    blist.add_argument("--baselines-dir", type=Path, default=Path(".gpubench/baselines"))


def _add_list(sub: Subcommands) -> None:
    lst = sub.add_parser("list", help="suites, workloads, frameworks and the devices detected here")
    lst.add_argument("--suites-dir", type=Path, metavar="DIR", help="where the suites are (default: suites/ here, "
                                                                    "if there is one)")


def _add_find_batch(sub: Subcommands) -> None:
    fb = sub.add_parser("find-batch", help="the largest batch that fits, per config: doubling then bisection, "
                                           "a fresh process per probe")
    fb.add_argument("suite", help="suite file, or a name in suites/ (its batch sizes are where the search starts)")
    add_suite_options(fb, "where the run directory of the probes goes (default: runs)", report=False)
    fb.add_argument("--limit", type=_positive_int, default=DEFAULT_LIMIT, metavar="N",
                    help=f"largest batch to try (default {DEFAULT_LIMIT})")
    fb.add_argument("--json", type=Path, metavar="FILE", help="write every search and its probes as JSON")
    add_launcher_options(fb)


def _add_advise(sub: Subcommands) -> None:
    adv = sub.add_parser("advise", help="measure the training practices that apply to one config on this machine "
                                        "(precision, compilation, memory format, optimizer, batch, input, memory), "
                                        "ranked with the gate's statistics; the best combination measured")
    adv.add_argument("suite", nargs="?", default="", help="suite file, or a name in suites/ (one config, after --set)")
    add_suite_options(adv, "where the run directory goes (default: runs)")
    adv.add_argument("--budget", type=_duration, default=900.0, metavar="TIME",
                     help="time for the measurements (900, 900s, 15m; default 15m): clear cases decide at the first "
                          "look, undecided ones get more rounds while it lasts")
    adv.add_argument("--alpha", type=float, default=0.05,
                     help="error rate of an improved (or regressed) call over all the practices (default 0.05)")
    adv.add_argument("--threshold", default=THRESHOLD,
                     help=f"the smallest speed-up (or slowdown) called one (default {THRESHOLD}%)")
    adv.add_argument("--noise-floor", default=NOISE_FLOOR, help=f"the gate's noise floor (default {NOISE_FLOOR}%)")
    adv.add_argument("--loss-tolerance", default="10%",
                     help="how far above the baseline's the loss after the same samples may end for a practice that "
                          "learns as well (default 10%%)")
    adv.add_argument("--only", action="append", default=[], metavar="GROUP",
                     help=f"measure only this group of practices (repeatable): {', '.join(GROUPS)}")
    adv.add_argument("--skip", action="append", default=[], metavar="GROUP", help="leave this group out (repeatable)")
    adv.add_argument("--markdown", type=Path, metavar="FILE", help="write the advice as markdown (a CI summary)")
    adv.add_argument("--json", type=Path, metavar="FILE", help="write the advice as JSON")
    adv.add_argument("--resume", type=Path, metavar="DIR", help="go on with an interrupted advise's run directory")
    add_launcher_options(adv)


def _add_bisect(sub: Subcommands) -> None:
    bis = sub.add_parser("bisect", help="find the commit that made training slower: a lockstep A/B of the ends, "
                                        "then of each midpoint against the last good commit, in cached worktrees")
    bis.add_argument("suite", nargs="?", default="", help="suite file (in the repository: each side reads its own "
                                                          "commit's copy), or a name in suites/")
    add_suite_options(bis, "where the bisection's directory goes (default: runs)", report=False)
    bis.add_argument("--good", default="", metavar="REV", help="a revision without the slowdown")
    bis.add_argument("--bad", default="", metavar="REV", help="a later revision with it")
    bis.add_argument("--repo", type=Path, default=Path("."), metavar="DIR",
                     help="the git repository: gpubench's own checkout, or your project whose model the suite names "
                          "(default: here)")
    bis.add_argument("--repeats", type=_positive_int, default=10, metavar="N",
                     help="lockstep rounds of each A/B's first look (default 10)")
    bis.add_argument("--budget", type=_duration, default=300.0, metavar="TIME",
                     help="each A/B: more rounds while undecided, within this time (default 5m)")
    bis.add_argument("--threshold", default="auto",
                     help="the smallest slowdown an A/B calls one; auto (the default): 3%% at the ends, then half "
                          "the slowdown the ends measured (at least 2%%)")
    bis.add_argument("--noise-floor", default=NOISE_FLOOR, help=f"the gate's noise floor (default {NOISE_FLOOR}%)")
    bis.add_argument("--alpha", type=float, default=ALPHA, help=f"each A/B's alpha (default {ALPHA})")
    add_worktree_options(bis)
    bis.add_argument("--markdown", type=Path, metavar="FILE", help="write the outcome as markdown (a CI summary)")
    bis.add_argument("--json", type=Path, metavar="FILE", help="write the outcome as JSON")
    bis.add_argument("--resume", type=Path, metavar="DIR", help="go on with an interrupted bisection's directory")


def _add_profile(sub: Subcommands) -> None:
    prof = sub.add_parser("profile", help="profile each config in a fresh process: operator tables, a trace, "
                                          "NVTX ranges on CUDA, the where-time-goes breakdown")
    prof.add_argument("suite", help="suite file, or a name in suites/")
    add_suite_options(prof)
    prof.add_argument("--steps", type=_positive_int, default=10, metavar="N",
                      help="steps of the breakdown pass and of the profiler pass (default 10)")
    prof.add_argument("--memory-history", action="store_true",
                      help="record the device allocator's history (PyTorch on CUDA) from before the model is built: "
                           "profile/<config>/memory_snapshot.pickle, for pytorch.org/memory_viz, and its largest "
                           "allocations in the result")
    add_launcher_options(prof)


def _add_calibrate(sub: Subcommands) -> None:
    cal = sub.add_parser("calibrate", help="measure this machine's peaks (matmul FLOP/s per precision, memory "
                                           "bandwidth) once, cached per environment; MFU is against them")
    cal.add_argument("--device", dest="devices", action="append", metavar="cpu|cuda|cuda:N",
                     help="device to calibrate (repeatable; gpu and gpu:N are aliases, as in suites; default: cpu, "
                          "and cuda:0 where NVML lists a GPU)")
    cal.add_argument("--force", action="store_true", help="measure again even if cached")
    cal.add_argument("--json", type=Path, metavar="FILE", help="write the figures (and datasheet labels) as JSON")


def _add_history(sub: Subcommands) -> None:
    hist = sub.add_parser("history", help="the results history: record runs, list, show and export them, chart "
                                           "them, find where they stepped")
    hist_sub = hist.add_subparsers(dest="action", required=True)
    h_ingest = hist_sub.add_parser("ingest", help="record existing run directories (a run already there adds nothing)")
    h_ingest.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    h_ingest.add_argument("--tag", dest="tags", action="append", default=[], metavar="KEY=VALUE",
                          help="a label for these runs (repeatable)")
    for name, text in (("list", "runs in the history, newest first"),
                       ("show", "results in the history, oldest first"),
                       ("export", "results in the history as CSV or Parquet (one row per result)"),
                       ("report", "a self-contained HTML dashboard: each config's metrics over the commits, per "
                                  "machine, and the latest value against the previous and the best"),
                       ("check", "the commits where a metric's series stepped (E-Divisive means); exit 1 when a "
                                 "regression is among a series' newest commits"),
                       ("noise", "each config's noise per machine, from results of the same commit, and the "
                                 "smallest slowdown the gate catches with it")):
        h = hist_sub.add_parser(name, help=text)
        h.add_argument("--suite", help="only runs of this suite")
        h.add_argument("--config", help="only configs whose id contains this text")
        h.add_argument("--machine", help="only runs on this machine (hostname, or a machine key's prefix)")
        h.add_argument("--branch", help="only runs of this branch")
        h.add_argument("--since", metavar="DATE", help="only runs created at or after this ISO date or time")
        if name in ("show", "report", "check", "noise"):
            h.add_argument("--metric", dest="metrics", action="append", default=[],
                           help="a metric to show (repeatable; default "
                                + {"show": "throughput and step_ms",
                                   "report": "throughput, and mfu and tensor_active_pct where results have them"}
                                .get(name, "throughput") + ")")
        if name in ("report", "check"):
            h.add_argument("--p-value", type=float, default=0.01, help="a step's significance (default 0.01)")
            h.add_argument("--permutations", type=int, default=199, help="of the permutation test (default 199)")
            h.add_argument("--min-size", type=int, default=3, metavar="N",
                           help="commits on each side of a step, at least (default 3)")
            h.add_argument("--threshold", default=THRESHOLD, help="a step smaller than this is small, neither a "
                                                            "regression nor an improvement (default 3%%)")
            h.add_argument("--recent", type=int, default=5, metavar="N",
                           help="a regression among a series' newest N commits fails the check (default 5)")
            h.add_argument("--last", type=int, default=300, metavar="N",
                           help="search only the newest N commits of each series (default 300; 0: all, whose cost "
                                "grows as the square of the commits)")
            h.add_argument("--together", action="store_true",
                           help="search the configs of each suite and machine together: a step that one change "
                                "made in many configs adds up over them (more power near the noise; a step in one "
                                "config among many has less)")
        if name == "noise":
            h.add_argument("--repeats", type=int, default=10, metavar="N", help="repeats a side (default 10)")
            h.add_argument("--configs", type=int, default=1, metavar="K",
                           help="configs compared at once: alpha / K per config (default 1)")
            _add_gate_statistics(h, figures_only=True)
            h.add_argument("--effect", default="5%", help="the slowdown whose repeats are asked for (default 5%%)")
        if name in ("check", "noise"):
            h.add_argument("--json", type=Path, metavar="FILE", help="write what is printed as JSON")
        if name == "check":
            h.add_argument("--bisect", metavar="SUITE",
                           help="then bisect the newest regression found: gpubench bisect SUITE from the commit "
                                "before the step to the commit after it (in --repo)")
            h.add_argument("--bisect-set", dest="bisect_sets", action="append", default=[], metavar="KEY=V",
                           help="--set for the bisection's suite (repeatable): narrow it to the regressed config")
            h.add_argument("--repo", type=Path, default=Path("."), metavar="DIR",
                           help="the git repository the history's commits are of (default: here)")
            h.add_argument("--bisect-budget", type=_duration, default=300.0, metavar="TIME",
                           help="each A/B of the bisection: more rounds while undecided, within this time "
                                "(default 5m)")
        if name == "report":
            h.add_argument("--no-changes", action="store_true", help="do not look for change points")
            h.add_argument("--out", type=Path, default=Path("reports") / "history", metavar="DIR",
                           help="where the dashboard goes (default reports/history)")
            h.add_argument("--pin", dest="pinned", action="append", default=[], metavar="CONFIG",
                           help="a config id to show first in each suite (repeatable)")
        if name == "export":
            h.add_argument("--out", type=Path, required=True, metavar="FILE", help="FILE.csv, or FILE.parquet "
                                                                                    "(needs pyarrow)")
    for h in hist_sub.choices.values():
        h.add_argument("--db", metavar="URL", help="the history: a file path, sqlite:///PATH or "
                       "postgresql://USER@HOST[:PORT]/NAME (default: $GPUBENCH_DB, else .gpubench/history.db)")


def _add_env(sub: Subcommands) -> None:
    env = sub.add_parser("env", help="print the environment fingerprint")
    env.add_argument("--json", action="store_true", help="as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="gpubench", description="Benchmark deep-learning training.")
    parser.add_argument("--version", action="version", version=f"gpubench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_run, _add_report, _add_compare, _add_ab, _add_export, _add_baseline, _add_list, _add_find_batch,
                _add_advise, _add_bisect, _add_profile, _add_calibrate, _add_history, _add_env):
        add(sub)
    _add_examples(parser)
    return parser


