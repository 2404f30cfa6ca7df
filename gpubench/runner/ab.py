"""``gpubench ab``: same-job A/B, the most robust way to gate in CI.

Every config runs alternately under a baseline and a candidate environment (two Python
interpreters, or two checkouts of a project, or both) on the same machine: A B, then B A in
the next round, and so on. Drift of the machine (thermal, other tenants, clock boosts)
lands on both sides alike, which a comparison against a stored baseline from another day
cannot promise. The two sides go to two run directories, which are then compared by the
regression gate.

``--lockstep`` goes further: the two workers of a round run at once and take turns window by
window (gpubench.measure.turns), and the rounds are compared paired. ``--budget`` makes the
gate sequential: more rounds for the undecided configs, look k at alpha / 2^k. ``--continue``
goes on with such an A/B that ended undecided: its rounds are pooled with the new ones and its
looks are counted on, so the two together still raise a false alarm at most alpha of the time
(a second A/B judged alone would spend alpha again).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console

from gpubench.config import Config
from gpubench.errors import EXIT_OK, EXIT_REGRESSED, InputError, stop_exit_code, stop_message, warn
from gpubench.files import read_user_text, write_text_atomic
from gpubench.gate import ALPHA, NOISE_FLOOR, THRESHOLD, render
from gpubench.gate.compare import (
    Comparison,
    GateOptions,
    compare,
    fingerprint_differences,
    gate_options,
    repeats_for,
)
from gpubench.launch import Interpreter, turn_pipes
from gpubench.results.outputs import check_output_file, write_output
from gpubench.results.result import Result
from gpubench.results.schema import FAILED_STATUSES
from gpubench.results.store import AB_FILE, json_text, load_results, load_run
from gpubench.runner.job import Job
from gpubench.runner.launcher import LauncherChoice
from gpubench.runner.local import Local
from gpubench.runner.models import user_code_path
from gpubench.runner.progress import SweepDisplay
from gpubench.runner.session import Session, load, report_beside
from gpubench.runner.sweep import plan
from gpubench.suite import MAX_BATCH

SIDES = ("baseline", "candidate")
CONTINUED_FILE = "continued.json"  # beside the sides of an A/B that --continue went on with


@dataclass
class ABRequest:
    suite: str
    baseline: Interpreter
    candidate: Interpreter
    out: Path = Path("runs")
    sets: list[str] = field(default_factory=list)
    repeats: int = 10
    threshold: str = THRESHOLD
    noise_floor: str = NOISE_FLOOR
    alpha: float = ALPHA
    metric: str = "throughput"
    markdown: Path | None = None
    json: Path | None = None
    report: bool = True
    report_dir: Path | None = None  # where the report goes (None: beside the runs)
    correction: str = "bonferroni"
    lockstep: bool = False
    budget_s: float | None = None  # sequential: more rounds while a config is undecided, within this time
    junit: Path | None = None
    best_of: int = 1  # lockstep: each side's best of k consecutive rounds makes one pair
    prior: Path | None = None  # the --json of a sequential lockstep A/B of the same sides to continue
    launcher: LauncherChoice | None = None  # --launcher and its options (None: this machine)


@dataclass
class _Prior:
    """A sequential lockstep A/B being continued: its rounds (and those of any A/B it continued
    in turn; pooled with the new ones, which are numbered after them), its looks (the new looks
    are counted on from them) and the run directories that hold its rounds, baseline then
    candidate of each A/B, oldest first."""

    results: dict[str, list[Result]]
    looks: list[dict[str, Any]]
    rounds: int
    dirs: list[str]

    def pairs(self, configs: list[Config]) -> int:
        """The fewest rounds ok on both sides that a config has (what the first look pools for it)."""
        def ok(side: str) -> set[tuple[str, int]]:
            return {(r.config_id, r.repeat) for r in self.results[side] if r.ok}

        both = ok("baseline") & ok("candidate")
        return min((sum(1 for cid, _ in both if cid == c.config_id) for c in configs), default=0)


def _prior(req: ABRequest, configs: list[Config], launchers: dict[str, Interpreter]) -> _Prior | None:
    """The A/B that ``--continue`` names, checked: the same sides, configs and gate settings
    that alpha's share depends on, lockstep, with --budget's looks (an A/B judged at the whole
    alpha has none left to spend) and a config still undecided at its last look."""
    if req.prior is None:
        return None
    where = f"--continue {req.prior}"
    if not req.lockstep:
        raise InputError(f"{where}: needs --lockstep (the rounds of a lockstep A/B are continued paired)")
    text = read_user_text(req.prior, "--continue")
    try:
        earlier = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InputError(f"{where}: not the --json of a gpubench ab ({type(e).__name__}); give the file an "
                         "ab --lockstep --budget wrote with --json") from None
    chain, looks, best_of, correction = _continued_fields(earlier, where)
    if not looks:
        raise InputError(f"{where}: that A/B was judged once at the whole alpha (no --budget), so none is left for "
                         "more rounds; continue an A/B run with --budget")
    spent = 2 * float(looks[0]["alpha"])  # look 1 was at alpha / 2
    if int(looks[-1]["undecided"]) == 0:
        raise InputError(f"{where}: every config of that A/B was decided at its last look; there is nothing to "
                         "continue")
    if abs(spent - req.alpha) > 1e-9 * req.alpha:
        raise InputError(f"{where}: that A/B ran at alpha {spent:g}, not {req.alpha:g}; give --alpha {spent:g} (its "
                         "looks spent that alpha's share)")
    if best_of != req.best_of:
        raise InputError(f"{where}: that A/B paired the best of {best_of} rounds; give --best-of {best_of}")
    if correction != req.correction:
        raise InputError(f"{where}: that A/B corrected for many configs with {correction}; give --correction "
                         f"{correction}")
    results: dict[str, list[Result]] = {side: [] for side in SIDES}
    ids = {c.config_id for c in configs}
    for i, run_dir in enumerate(chain):
        side = SIDES[i % 2]
        args = load_run(run_dir).get("args") or {}
        if not args.get("lockstep"):
            raise InputError(f"{where}: {run_dir} is not a side of a lockstep A/B")
        ran = (args.get("python"), args.get("pythonpath"), list(args.get("code_path") or []))
        given = (launchers[side].python, launchers[side].pythonpath, list(launchers[side].code_path))
        if ran != given:
            raise InputError(f"{where}: its {side} ({run_dir}) ran {ran[0]} with PYTHONPATH {ran[1] or '(none)'} and "
                             f"code from {', '.join(ran[2]) or '(none)'}, not {given[0]} with {given[1] or '(none)'} "
                             f"and {', '.join(given[2]) or '(none)'}; continue it with the same sides")
        results[side] += load_results(run_dir)
    for side in SIDES:
        had = {r.config_id for r in results[side]}
        if had != ids:
            odd = sorted(had ^ ids)[0]
            raise InputError(f"{where}: config {odd} is in {'that A/B' if odd in had else 'this suite'} but not in "
                             f"{'this suite and --set' if odd in had else 'that A/B'}; continue it with the same "
                             "suite and --set")
    taken = continued_marker(chain[-2])
    if taken.exists():
        raise InputError(f"{where}: that A/B was continued already ({taken}), which spent its next looks' alpha; "
                         "continue the A/B that continued it (its --json)")
    rounds = max((r.repeat for r in results["baseline"]), default=-1) + 1
    return _Prior(results, looks, rounds, [str(d) for d in chain])


def continued_marker(baseline_dir: Path) -> Path:
    """Where an A/B whose baseline side is ``baseline_dir`` is marked as continued (CONTINUED_FILE,
    beside its sides)."""
    return baseline_dir.parent / CONTINUED_FILE


def _continued_fields(earlier: Any, where: str) -> tuple[list[Path], list[dict[str, Any]], int, str]:
    """The fields of an ab --json that a continuation rests on, each checked by type and range
    (a hand-edited or damaged file is one line naming the field): the run directories (pooled
    ones first, then baseline and candidate), the looks, best-of and the correction."""
    def bad(field: str, wanted: str) -> InputError:
        return InputError(f"{where}: {field}: expected {wanted}; give the file an ab --lockstep --budget wrote with "
                          "--json")

    def number(value: Any, field: str, lo: float, hi: float, integer: bool = False) -> float:
        ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or not math.isfinite(value) or not lo <= value <= hi:
            raise bad(field, f"{'an integer' if integer else 'a number'} from {lo:g} to {hi:g}")
        return float(value)

    if not isinstance(earlier, dict):
        raise bad("the file", f"a JSON object, not a {type(earlier).__name__}")
    pooled = earlier.get("pooled_with", [])
    if not isinstance(pooled, list) or not all(isinstance(d, str) and d for d in pooled) or len(pooled) % 2:
        raise bad("pooled_with", "a list of run directories, a baseline and a candidate each")
    for side in SIDES:
        if not isinstance(earlier.get(side), str) or not earlier[side]:
            raise bad(side, "the path of its run directory")
    looks = earlier.get("looks")
    if not isinstance(looks, list) or not all(isinstance(x, dict) for x in looks):
        raise bad("looks", "a list of objects")
    for k, x in enumerate(looks):
        number(x.get("alpha"), f"looks[{k}].alpha", 1e-300, 0.5)
        number(x.get("undecided"), f"looks[{k}].undecided", 0, 10**9, integer=True)
        number(x.get("rounds"), f"looks[{k}].rounds", 0, 10**9, integer=True)
    best_of = int(number(earlier.get("best_of", 1), "best_of", 1, 10**6, integer=True))
    correction = earlier.get("correction", "bonferroni")
    if correction not in ("bonferroni", "bh"):
        raise bad("correction", "bonferroni or bh")
    return [Path(d) for d in [*pooled, earlier["baseline"], earlier["candidate"]]], looks, best_of, correction


def _check_python(launcher: Interpreter, side: str) -> None:
    if shutil.which(launcher.python) is None and not Path(launcher.python).is_file():
        raise InputError(f"--{side}-python {launcher.python}: no such interpreter")
    for part in (launcher.pythonpath or "").split(os.pathsep) if launcher.pythonpath else []:
        if not Path(part).is_dir():
            raise InputError(f"--{side}-path {launcher.pythonpath}: no such directory: {part}")


def side_code_paths(launchers: dict[str, Interpreter], configs: list[Config], suite_source: str
                    ) -> dict[str, Interpreter]:
    """Each side imports the user's own code (a suite's factories) from its own checkout.

    ``--baseline-path`` / ``--candidate-path`` name checkouts (or several directories, joined as
    PYTHONPATH is): of gpubench itself (a ``gpubench`` package inside one: the side imports that
    gpubench), or of the user's project (the side keeps this gpubench and imports the project's
    code from its checkout). The suite file lies in one of the checkouts (a side without a path
    is the working directory's): its directory, relative to that checkout, is where each side
    finds the factories in its own checkout. A suite outside every checkout gives both sides its
    own directory. Without user code in the suite the launchers are unchanged."""
    code = user_code_path(configs, suite_source)

    def parts(launcher: Interpreter) -> list[str]:
        return [p for p in (launcher.pythonpath or "").split(os.pathsep) if p]

    def project(launcher: Interpreter) -> bool:
        return bool(parts(launcher)) and not any((Path(p) / "gpubench" / "__init__.py").is_file()
                                                 for p in parts(launcher))

    if not code and not any(project(launcher) for launcher in launchers.values()):
        return launchers
    roots = {side: Path((parts(launcher) or [os.getcwd()])[0]).resolve() for side, launcher in launchers.items()}
    suite_dir = Path(suite_source).resolve().parent
    holder = next((root for side, root in roots.items() if suite_dir.is_relative_to(root)
                   and launchers[side].pythonpath), None) or next(
                       (root for root in roots.values() if suite_dir.is_relative_to(root)), None)
    out = {}
    for side, launcher in launchers.items():
        path: tuple[str, ...] = ()
        if code:
            path = (str(roots[side] / suite_dir.relative_to(holder)),) if holder is not None else code
        if project(launcher):  # the user's project: this gpubench, the project's code from its checkout
            out[side] = replace(launcher, pythonpath=None, isolated=True,
                                code_path=tuple(dict.fromkeys((*path, *(str(Path(p).resolve())
                                                                         for p in parts(launcher))))))
        else:
            out[side] = replace(launcher, code_path=path, isolated=bool(path))
    return out


def _lockstep_round(job: Job, order: tuple[str, ...], sides: dict[str, Session]) -> dict[str, Result]:
    """One round in lockstep: both sides' workers at once, taking turns window by window
    through two pipes (gpubench.measure.turns); ``order[0]`` trains first."""
    ends = dict(zip(order, turn_pipes()))

    def side_round(side: str) -> Result:
        try:
            return sides[side].one(job, turns=ends[side])
        finally:  # a side that started no worker (its device missing, say) must not keep the other waiting
            ends[side].close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {side: pool.submit(side_round, side) for side in order}
        return {side: f.result() for side, f in futures.items()}


def look_alpha(alpha: float, look: int) -> float:
    """The level of look ``look`` (1, 2, ...) of a sequential A/B (``--budget``): alpha / 2^look,
    so that however many looks the budget allows, their levels add up to less than alpha and
    a gate that looks again and again still raises a false alarm at most that often."""
    return alpha / 2 ** look


def _rounds(jobs: list[Job], lockstep: bool, sides: dict[str, Session], results: dict[str, list[Result]]) -> None:
    """Both sides of each job (in lockstep or one after the other), appended to ``results``."""
    with SweepDisplay(sides["baseline"].console, 2 * len(jobs)) as display:
        for n, job in enumerate(jobs):
            order = SIDES if job.repeat % 2 == 0 else SIDES[::-1]  # A B, then B A, ...
            if lockstep:
                for i, side in enumerate(order):
                    display.started(2 * n + i, job, side)
                done = _lockstep_round(job, order, sides)
                for i, side in enumerate(order):
                    results[side].append(done[side])
                    display.finished(2 * n + i, job, done[side], side)
                continue
            for i, side in enumerate(order):
                display.started(2 * n + i, job, side)
                result = sides[side].one(job, note=display.note)
                results[side].append(result)
                display.finished(2 * n + i, job, result, side)


def execute_ab(req: ABRequest, console: Console) -> int:
    """The A/B; its exit code. Both sides' run directories are locked while it writes them."""
    with ExitStack() as held:
        return _execute_ab(req, console, held)


def _execute_ab(req: ABRequest, console: Console, held: ExitStack) -> int:
    options = gate_options(req.threshold, req.noise_floor, req.alpha, req.metric, req.correction,
                           req.best_of)  # before any run
    suite = load(req.suite, req.sets, req.repeats)
    configs = suite.expand()
    _refuse(req, configs, suite.source)
    launchers = {"baseline": req.baseline, "candidate": req.candidate}
    for side, launcher in launchers.items():
        _check_python(launcher, side)
    launchers = side_code_paths(launchers, configs, suite.source)
    sides = {side: Session(console, req.launcher or Local(), launchers[side], label=f"{side} ") for side in SIDES}
    sides["baseline"].check(configs, suite.source, req.out)
    prior = _prior(req, configs, launchers)
    first_alpha = (look_alpha(req.alpha, len(prior.looks) + 1) if prior is not None
                   else look_alpha(req.alpha, 1) if req.budget_s else req.alpha)
    needed = repeats_for(first_alpha, len(configs), options.correction, req.lockstep, req.best_of)
    repeats = req.repeats
    if prior is not None:  # the pooled rounds make the first look: as many new ones as it needs, in whole bests-of
        repeats = max(req.repeats, needed - prior.pairs(configs))
        repeats = -(-repeats // req.best_of) * req.best_of
    elif req.repeats < needed:
        raise InputError(f"--repeats {req.repeats}: comparing {len(configs)} config(s) at alpha {first_alpha:g}"
                         f"{' (the first look of --budget)' if req.budget_s else ''} needs at least {needed} "
                         f"{'rounds' if req.lockstep else 'repeats per side'}")
    for path, option in ((req.markdown, "--markdown"), (req.json, "--json"), (req.junit, "--junit")):
        check_output_file(path, option)
    for side in SIDES:  # each side's own frameworks and models, built with its own code
        sides[side].probe(configs, suite.source)
    for d in fingerprint_differences(sides["baseline"].env, sides["candidate"].env, {c.framework for c in configs}):
        warn(f"environments differ (this may be the change under test): {d}")
    # unique, as a run's id is (two A/Bs started in the same second never share a directory or id)
    stamp = f"{suite.name}-ab-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
    root = req.out / stamp
    for side in SIDES:  # each side locked for the whole A/B: one writer of each
        args = {"suite": req.suite, "set": req.sets, "repeats": repeats, "out": str(req.out), "ab_side": side,
                "python": launchers[side].python, "pythonpath": launchers[side].pythonpath,
                "lockstep": req.lockstep, "budget_s": req.budget_s, "ab_id": stamp,
                "continues": prior.dirs if prior is not None else []}  # and code_path: Session.open
        sides[side].open(held, root, f"{stamp}-{side}", suite, args, configs, dir_name=side)
    console.print(f"A/B {stamp}: {len(configs)} configs x {repeats} {'rounds' if req.lockstep else 'repeats'} x 2 "
                  f"sides{f', then more while undecided, within {req.budget_s:g} s' if req.budget_s else ''} -> {root}",
                  highlight=False)
    results: dict[str, list[Result]] = {side: list(prior.results[side]) if prior else [] for side in SIDES}
    try:
        looks, comparison = _rounds_and_looks(req, options, configs, repeats, prior, sides, results)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (errors.Stopped): the finished rounds stay
        stop_message(e, f"the finished rounds are in {root / 'baseline'} and {root / 'candidate'}; judge them with: "
                        f"gpubench compare {root / 'baseline'} {root / 'candidate'} (or run the A/B again)")
        return stop_exit_code(e)
    for side in SIDES:
        sides[side].finish()
    return _conclude(req, options, sides, root, prior, results, looks, comparison)


def _refuse(req: ABRequest, configs: list[Config], source: str) -> None:
    """What an A/B cannot compare, in one line, before anything runs."""
    if req.best_of > 1 and not req.lockstep:
        raise InputError(f"--best-of {req.best_of}: needs --lockstep (the best of consecutive paired rounds)")
    searched = [c.config_id for c in configs if c.batch_size == MAX_BATCH]
    if searched:  # each side's search could settle on another batch near the memory limit
        raise InputError(f"{source}: batch_size: \"max\" is not for gpubench ab, whose two sides must train "
                         f"the same batch ({searched[0]}); find it with gpubench find-batch and give the number")
    if req.lockstep and req.launcher is not None and req.launcher.remote:
        raise InputError(f"--lockstep with --launcher {req.launcher.name}: the two sides of a lockstep round take "
                         "turns on one machine through pipes, which jobs the scheduler places apart cannot share; "
                         "leave out --lockstep (the rounds then alternate A B, B A as jobs), or run the A/B on a node")
    if req.lockstep:
        distributed = [c.config_id for c in configs if c.distributed]
        if distributed:
            raise InputError(f"{source}: --lockstep runs one process a side, not a distributed config's many "
                             f"({distributed[0]}); leave out --lockstep, or the config")


def _rounds_and_looks(req: ABRequest, options: GateOptions, configs: list[Config], repeats: int,
                      prior: _Prior | None, sides: dict[str, Session], results: dict[str, list[Result]]
                      ) -> tuple[list[dict[str, Any]], Comparison | None]:
    """The rounds, then (``--budget``, ``--continue``) the looks: more rounds of the undecided
    configs while the budget lasts. The looks, and the last look's comparison where a look ended
    the rounds."""
    console = sides["baseline"].console
    looks: list[dict[str, Any]] = list(prior.looks) if prior else []
    before: set[tuple[str, int]] = set()  # the rounds continued, numbered before the new ones
    if prior is not None:
        before = {(c.config_id, r) for c in configs for r in range(prior.rounds)}
        console.print(f"continuing {len(looks)} look(s) and {prior.rounds} round(s) of "
                      f"{', '.join(prior.dirs[-2:])}: pooled with the new rounds, the next look at alpha "
                      f"{look_alpha(req.alpha, len(looks) + 1):.3g}", highlight=False, soft_wrap=True)
    t0 = time.monotonic()
    _rounds(plan(configs, (prior.rounds if prior else 0) + repeats, before), req.lockstep, sides, results)
    while req.budget_s or (prior is not None and len(looks) == len(prior.looks)):
        alpha_look = look_alpha(req.alpha, len(looks) + 1)
        done = {(r.config_id, r.repeat) for r in results["baseline"]}
        rounds = max((r for _, r in done), default=-1) + 1
        try:
            at_look = _compare(req, options, results, alpha_look)
        except InputError:  # said again, with the whole run, below: at this look's alpha, which it spent
            looks.append({"look": len(looks) + 1, "rounds": rounds, "alpha": alpha_look, "undecided": len(configs)})
            break
        undecided = [v.config_id for v in at_look.verdicts if v.verdict == "inconclusive"]
        looks.append({"look": len(looks) + 1, "rounds": rounds, "alpha": alpha_look, "undecided": len(undecided)})
        elapsed = time.monotonic() - t0
        ran = len(done - before) or 1  # this A/B's own rounds took the time so far
        fit = int(((req.budget_s or 0) - elapsed) / (elapsed / ran)) // max(1, len(undecided))
        # the rounds so far again (looks at doubling counts), as many as the budget allows, in whole bests-of
        more = min(rounds, fit) // req.best_of * req.best_of
        if not undecided or more < 1:
            why = ("every config decided" if not undecided else f"the budget ({req.budget_s:g} s) is spent"
                   if req.budget_s else "no --budget for more rounds")
            console.print(f"look {len(looks)}: {rounds} rounds, alpha {alpha_look:.3g}: {why}", highlight=False)
            return looks, at_look
        console.print(f"look {len(looks)}: {rounds} rounds, alpha {alpha_look:.3g}: {len(undecided)} "
                      f"undecided, {more} more round(s)", highlight=False)
        more_jobs = plan([c for c in configs if c.config_id in undecided], rounds + more, done)
        _rounds(more_jobs, req.lockstep, sides, results)
    return looks, None


def _compare(req: ABRequest, options: GateOptions, results: dict[str, list[Result]], alpha: float) -> Comparison:
    """The gate's verdicts on the two sides' results, at ``alpha``."""
    return compare(results["baseline"], results["candidate"], options.metric, options.threshold, options.noise_floor,
                   alpha, SIDES, options.correction, paired=req.lockstep, best_of=req.best_of)


def _conclude(req: ABRequest, options: GateOptions, sides: dict[str, Session], root: Path, prior: _Prior | None,
              results: dict[str, list[Result]], looks: list[dict[str, Any]], comparison: Comparison | None) -> int:
    """The verdicts: printed, written (--markdown, --json, --junit, ab.json beside the sides),
    the report of the two sides; the exit code."""
    console = sides["baseline"].console
    dirs = {side: sides[side].run_dir for side in SIDES}
    alpha_final = looks[-1]["alpha"] if looks else options.alpha
    # this A/B's own failed repeats (a continued A/B's were its to report)
    failed = [(side, r) for side in SIDES for r in results[side][len(prior.results[side]) if prior else 0:]
              if r.status in FAILED_STATUSES]
    for side, r in failed:
        console.print(f"[red]{r.status}[/red] ({side}) {r.config_id}: {r.reason}", highlight=False)
    if comparison is None:
        comparison = _compare(req, options, results, alpha_final)
    reproduce = render.compare_command(str(dirs["baseline"]), str(dirs["candidate"]),
                                       replace(options, alpha=alpha_final), force=True)
    if prior is not None:
        reproduce += f" (this A/B's own rounds; its verdicts pool them with those of {', '.join(prior.dirs)})"
    power, triaged = render.show(console, comparison, SIDES, results["baseline"], results["candidate"], reproduce)
    if req.markdown:
        write_output(req.markdown, render.markdown(comparison, SIDES, power, triaged), "--markdown")
    verdicts = json_text({"baseline": str(dirs["baseline"].resolve()), "candidate": str(dirs["candidate"].resolve()),
                          **comparison.to_dict(), "header": render.header(comparison, SIDES), "power": power,
                          "table": [render.cells(comparison, v) for v in comparison.verdicts],
                          "looks": looks, "triage": triaged, "pooled_with": prior.dirs if prior is not None else [],
                          "failed": [{"side": side, "config_id": r.config_id, "repeat": r.repeat,
                                      "status": r.status, "reason": r.reason} for side, r in failed]})
    write_text_atomic(root / AB_FILE, verdicts)  # beside the two sides: what their report shows as the verdict
    if prior is not None:  # its next looks' alpha is spent: a second continuation of it is refused (_prior)
        write_text_atomic(continued_marker(Path(prior.dirs[-2])), json_text({"by": str(root.resolve())}))
    if req.json:
        write_output(req.json, verdicts, "--json")
    if req.junit:
        write_output(req.junit, render.junit(comparison, SIDES, power, triaged), "--junit")
    if req.report:
        sides["baseline"].report([dirs["baseline"], dirs["candidate"]], out=req.report_dir or report_beside(root))
    console.print(f"run directories: {dirs['baseline']} {dirs['candidate']}", highlight=False)
    return EXIT_REGRESSED if comparison.regressed or failed else EXIT_OK
