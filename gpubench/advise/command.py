"""``gpubench advise``: measure the training practices that apply to one config on this machine,
rank them with the gate's statistics, measure the best combination, and print the suite lines
of the best config.

One run directory holds every measurement (the baseline and each practice are configs of it,
each repeat a fresh worker process, as ``run``'s): the report, the gate and the history read it
like any other, and ``--resume DIR`` goes on where an interrupted advise stopped (what was
measured is kept and reused; the decisions are made again from it). The rounds interleave the
baseline and the practices (the order turning each round) so that drift of the machine lands on
all of them. The first look judges each practice at alpha / 2 (Bonferroni over the practices and
the combination); undecided practices get more rounds, with the baseline, at alpha / 4, ... as
``ab --budget`` does, while the time budget allows; clear cases decide at the first look.
"""

from __future__ import annotations

import math
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpubench import fmt
from gpubench.advise.judge import Judging, Row, combine, guide, judge, rank
from gpubench.advise.practices import GROUPS, Practice, Skipped, candidates, memory_followups, no_memory_limit
from gpubench.config import Config
from gpubench.errors import EXIT_BASELINE_FAILED, EXIT_OK, InputError, stop_exit_code, stop_message
from gpubench.files import write_text_atomic
from gpubench.gate import NOISE_FLOOR, THRESHOLD
from gpubench.gate.compare import parse_fraction
from gpubench.gate.power import MAX_REPEATS
from gpubench.gate.stats import min_repeats
from gpubench.launch import Interpreter
from gpubench.results.metrics import BY_NAME
from gpubench.results.outputs import check_output_file, write_output
from gpubench.results.result import Result
from gpubench.results.store import json_text, load_results, load_run
from gpubench.runner.ab import look_alpha
from gpubench.runner.job import Job
from gpubench.runner.launcher import LauncherChoice
from gpubench.runner.local import Local
from gpubench.runner.models import user_code_path
from gpubench.runner.session import Session, load, resumed_choice, resumed_code_path
from gpubench.runner.sweep import pre_resolve
from gpubench.suite import MAX_BATCH, Suite

ADVICE_JSON, ADVICE_MD = "advice.json", "advice.md"
COMBINATION_ROUNDS = 1000  # the combination's rounds (and the baseline's beside it) are numbered from here
COLUMNS = ("#", "practice", "verdict", "speed-up", "interval", "memory", "cold start", "pays back", "loss", "note")
# what the speed-up is, by what the practices are judged on: (the ratio, how a best row reads it)
SPEEDUP = {"throughput": ("throughput / the baseline's", "the baseline's throughput"),
           "time_to_target_s": ("the baseline's time to target / the practice's",
                                "as fast to the target as the baseline (its time to target over the practice's)")}


@dataclass
class AdviseRequest:
    suite: str = ""
    sets: list[str] = field(default_factory=list)
    out: Path = Path("runs")
    budget_s: float = 900.0
    alpha: float = 0.05
    threshold: str = THRESHOLD
    noise_floor: str = NOISE_FLOOR
    loss_tolerance: str = "10%"
    only: list[str] = field(default_factory=list)  # practice groups to measure (none: all)
    skip: list[str] = field(default_factory=list)  # practice groups not to measure
    markdown: Path | None = None
    json: Path | None = None
    report: bool = True
    report_dir: Path | None = None  # where the report goes (None: beside the runs)
    resume: Path | None = None
    code_path: tuple[str, ...] | None = None  # where workers import the user's code (the Python API)
    launcher: LauncherChoice | None = None  # --launcher and its options (None: this machine, or a resumed run's)


@dataclass
class Candidate:
    practice: Practice
    config: Config


STORED = ("suite", "sets", "alpha", "threshold", "noise_floor", "loss_tolerance", "only", "skip")


def _resumed(req: AdviseRequest) -> tuple[AdviseRequest, list[Result]]:
    """On --resume: the advise's own settings from its run.json (what was measured was measured
    under them), this call's budget and outputs, and the results so far."""
    if req.resume is None:
        return req, []
    args = (load_run(req.resume).get("args") or {})
    stored = args.get("advise")
    if not isinstance(stored, dict):
        raise InputError(f"--resume {req.resume}: not a gpubench advise run (run.json has no args.advise); "
                         "resume a run with gpubench run --resume")
    for key in STORED:
        if key in stored:
            setattr(req, key, stored[key])
    if (stored := resumed_code_path(args)) is not None:
        req.code_path = stored
    req.launcher = resumed_choice(req.launcher, args, req.resume)
    return req, load_results(req.resume, strict=False)


def _check_groups(req: AdviseRequest) -> None:
    for option, names in (("--only", req.only), ("--skip", req.skip)):
        for name in names:
            if name not in GROUPS:
                raise InputError(f"{option} {name}: unknown practice group; one of: {', '.join(GROUPS)}")
    if req.only and all(g in req.skip for g in req.only):
        raise InputError(f"--only {' '.join(req.only)} with --skip {' '.join(req.skip)}: every group named is skipped, "
                         "so nothing would be measured; leave out one of them")


def _wanted(group: str, req: AdviseRequest) -> bool:
    """Whether --only / --skip let the practice group ``group`` be measured."""
    return (not req.only or group in req.only) and group not in req.skip


def _config_of(suite: Suite, sets: list[str], practice: Practice, base: Config) -> Config | str:
    """The config the practice makes of the baseline, or why it makes none."""
    try:
        configs = suite.with_overrides(sets + practice.set_args).expand()
    except InputError as e:
        return str(e)
    if len(configs) != 1:
        return f"makes {len(configs)} configs of this suite, not one"
    if configs[0].config_id == base.config_id:
        return "changes nothing for this config"
    return configs[0]


def execute_advise(req: AdviseRequest, console: Console) -> int:
    """The advise; its exit code: 0, or 1 when the baseline itself does not train. Bad input
    raises InputError (exit 2) before anything is written."""
    with ExitStack() as held:
        return _advise(req, console, held)


def _advise(req: AdviseRequest, console: Console, held: ExitStack) -> int:
    req, earlier = _resumed(req)
    _check_groups(req)
    if not 0 < req.alpha < 0.5:
        raise InputError(f"--alpha {req.alpha}: must be above 0 and below 0.5")
    if req.budget_s <= 0:
        raise InputError(f"--budget {req.budget_s:g}: must be a positive number of seconds")
    suite = load(req.suite, req.sets)
    configs = suite.expand()
    if len(configs) != 1:
        shown = ", ".join(c.config_id for c in configs[:3]) + (", ..." if len(configs) > 3 else "")
        raise InputError(f"{suite.source}: advise measures one config; with these --set the suite makes "
                         f"{len(configs)} ({shown}); narrow it with --set KEY=VALUE")
    base = configs[0]
    judging = Judging(req.alpha, parse_fraction(req.threshold, "--threshold"),
                      parse_fraction(req.noise_floor, "--noise-floor"),
                      parse_fraction(req.loss_tolerance, "--loss-tolerance"),
                      metric="time_to_target_s" if base.target_loss > 0 else "throughput")
    if base.batch_size == MAX_BATCH:
        raise InputError(f'{suite.source}: batch_size: "max" is not for gpubench advise, whose practices are measured '
                         "at one batch; find it with gpubench find-batch and give the number")
    if base.distributed:
        raise InputError(f"{suite.source}: parallelism: advise measures a config on one process; {base.parallelism} "
                         "starts several (advise its single-device config)")
    code_path = req.code_path if req.code_path is not None else user_code_path([base], suite.source)
    run = Session(console, req.launcher or Local(), Interpreter(code_path=code_path))
    run.check([base], suite.source, req.out, fresh=req.resume is None)
    for path, option in ((req.markdown, "--markdown"), (req.json, "--json")):
        check_output_file(path, option)
    practices, skipped = candidates(base)
    cands: list[Candidate] = []
    for p in practices:
        if p.group == "batch" and not _wanted("batch", req) and _wanted("memory", req):  # the memory group's probe
            if any(c.practice.group == "probe" for c in cands):  # one larger batch probes the memory
                continue
            p = replace(p, group="probe")
        elif not _wanted(p.group, req):
            continue
        made = _config_of(suite, req.sets, p, base)
        if isinstance(made, str):
            skipped.append(Skipped(p.name, p.group, made))
        else:
            cands.append(Candidate(p, made))
    skipped = [s for s in skipped if _wanted(s.group, req)]
    run.probe([base], suite.source)
    if req.resume is not None:
        run.reopen(held, req.resume)
    else:
        args: dict[str, Any] = {"suite": req.suite, "set": req.sets, "out": str(req.out), "repeats": 1,
                                "advise": {k: getattr(req, k) for k in STORED}}
        run.open(held, req.out, f"{suite.name}-advise-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}", suite, args,
                 [base] + [c.config for c in cands])
    session = _Session(req, run, base, judging, earlier)
    try:
        code = session.advise(cands, skipped, suite)
    except KeyboardInterrupt as e:
        stop_message(e, f"what was measured is in {run.run_dir}; go on with: gpubench advise --resume {run.run_dir}")
        return stop_exit_code(e)
    run.finish()
    if req.report:
        run.report(out=req.report_dir)
    console.print(f"run directory: {run.run_dir}", highlight=False)
    return code


class _Session:
    """One advise's measurements and decisions, in the run directory of ``run``."""

    def __init__(self, req: AdviseRequest, run: Session, base: Config, judging: Judging,
                 earlier: list[Result]) -> None:
        self.req, self.run, self.console, self.run_dir = req, run, run.console, run.run_dir
        self.base, self.judging = base, judging
        self.results: dict[str, list[Result]] = {}
        for r in earlier:
            self.results.setdefault(r.config_id, []).append(r)
        self.t0 = time.monotonic()
        self.jobs_run = 0

    # --- measuring ----------------------------------------------------------------------

    def _of(self, config: Config) -> list[Result]:
        return self.results.setdefault(config.config_id, [])

    def _has(self, config: Config, repeat: int) -> bool:
        return any(r.repeat == repeat for r in self._of(config))

    def measure(self, configs: list[Config], repeats: range) -> None:
        """Each config at each repeat not measured yet, in rounds, the order turning each round."""
        jobs = []
        for k in repeats:
            turn = k % len(configs)
            jobs += [Job(c, k) for c in configs[turn:] + configs[:turn] if not self._has(c, k)]
        if not jobs:
            return
        def finished(result: Result) -> None:
            self.results.setdefault(result.config_id, []).append(result)
            self.jobs_run += 1

        self.run.sweep(jobs, finished)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def per_job(self) -> float:
        return self.elapsed() / max(1, self.jobs_run)

    def fits(self, jobs: int, reserve: int = 0) -> bool:
        """Whether ``jobs`` more (and ``reserve`` kept for later) fit in the budget at the pace so far."""
        return self.jobs_run == 0 or self.elapsed() + (jobs + reserve) * self.per_job() <= self.req.budget_s

    # --- the advise -------------------------------------------------------------------------

    def advise(self, cands: list[Candidate], skipped: list[Skipped], suite: Suite) -> int:
        base = self.base
        for c in list(cands):  # what cannot run here needs no worker: it does not apply, with the reason
            why = self.cannot_run(c.config)
            if why is not None:
                skipped.append(Skipped(c.practice.name, c.practice.group, why))
                cands.remove(c)
        if (refused := self.cannot_run(base)) is not None:
            return self.baseline_failed(refused, skipped)
        self.console.print(f"advise {self.run.meta['run_id']}: baseline {base.config_id}; {len(cands)} practice(s) to "
                           f"measure, within {self.req.budget_s:g} s -> {self.run_dir}", highlight=False)
        self.measure([base] + [c.config for c in cands], range(1))
        first = self._of(base)
        if not any(r.ok for r in first):
            bad = first[0] if first else None
            return self.baseline_failed(f"{bad.status}: {bad.reason}" if bad else "not measured", skipped)
        live = [c for c in cands if any(r.ok for r in self._of(c.config)) and c.practice.group != "probe"]
        batch = next((c for c in cands if c.practice.group in ("batch", "probe")), None)
        if batch is not None and any(r.status == "oom" for r in self._of(batch.config)) and \
                _wanted("memory", self.req):
            more, why_not = memory_followups(base)
            skipped += why_not
            for p in more:
                made = _config_of(suite, self.req.sets, p, base)
                if isinstance(made, str):
                    skipped.append(Skipped(p.name, p.group, made))
                    continue
                why = self.cannot_run(made)
                if why is not None:
                    skipped.append(Skipped(p.name, p.group, why))
                    continue
                cands.append(Candidate(p, made))
                self.measure([made], range(1))
                if any(r.ok for r in self._of(made)):
                    live.append(cands[-1])
        elif batch is not None and _wanted("memory", self.req):
            skipped.append(no_memory_limit())
        compared = len(live) + 1  # the practices and the combination share alpha
        rows = self.looks(live, compared)
        rows += [judge(c.practice, self.beside_practices(), self._of(c.config), self.judging, compared)
                 for c in cands if c not in live and c.practice.group != "probe"]
        for r in rows:  # what an undecided practice would need, at the next look's level
            guide(r, look_alpha(self.req.alpha, self.looks_done + 1) / compared, self.judging)
        combo = self.combination(rows, suite, compared)
        return self.finish(rank(rows), combo, skipped)

    def cannot_run(self, config: Config) -> str | None:
        """Why ``config`` cannot run here ("status: reason": no such framework, device or
        combination), found without a worker; None when it can."""
        resolved = pre_resolve(config, self.run.probes)
        return f"{resolved[0]}: {resolved[1]}" if resolved is not None else None

    def beside_practices(self) -> list[Result]:
        """The baseline's repeats of the practices' rounds (not those beside the combination)."""
        return [r for r in self._of(self.base) if r.repeat < COMBINATION_ROUNDS]

    def looks(self, live: list[Candidate], compared: int) -> list[Row]:
        """Rounds of the live practices with the baseline, and looks at them (alpha / 2^k) until
        each is decided or the budget is spent; the rows at the last look's level. A round
        missing from an interrupted advise (--resume) is measured again first."""
        rounds = min_repeats(2 * look_alpha(self.req.alpha, 1) / compared)
        # the combination's rounds (at a later look's level), kept for it
        reserve = 3 * min_repeats(2 * look_alpha(self.req.alpha, 2) / compared) if len(live) >= 2 else 0
        undecided = list(live)
        look, rows, target = 0, {}, 0
        self.looks_done = 0
        while undecided:
            configs = [self.base] + [c.config for c in undecided]
            target = rounds if look == 0 else min(2 * target, target + max(1, self._fit(len(configs), reserve)))
            k = 0
            # the first look's rounds are what any verdict needs: the combination's reserve
            # holds back only the rounds after them
            held = reserve if look > 0 else 0
            while k < target:
                if not all(self._has(c, k) for c in configs):
                    if not self.fits(len(configs), held):
                        break
                    self.measure(configs, range(k, k + 1))
                k += 1
            look += 1
            self.looks_done = look
            alpha_look = look_alpha(self.req.alpha, look)
            j = replace(self.judging, alpha=alpha_look)
            for c in undecided:
                rows[c.config.config_id] = judge(c.practice, self.beside_practices(), self._of(c.config), j, compared)
            before = len(undecided)
            undecided = [c for c in undecided if rows[c.config.config_id].verdict == "inconclusive"]
            spent = k < target or not self.fits(len(undecided) + 1, reserve)  # no room for another look
            self.console.print(f"look {look}: {k} round(s), alpha {alpha_look:.3g}: {before - len(undecided)} "
                               f"decided, {len(undecided)} undecided"
                               + (f"; the budget ({self.req.budget_s:g} s) is spent" if undecided and spent else ""),
                               highlight=False)
            if spent:
                break
        self.final_alpha = look_alpha(self.req.alpha, max(1, look))
        return [rows[c.config.config_id] for c in live if c.config.config_id in rows]

    def _fit(self, per_round: int, reserve: int) -> int:
        left = self.req.budget_s - self.elapsed() - reserve * self.per_job()
        return int(left / (per_round * self.per_job())) if self.per_job() > 0 else 0

    def combination(self, rows: list[Row], suite: Suite, compared: int) -> Row | None:
        """The practices that helped, the best of each group, together, measured against the
        baseline in rounds of their own (None when fewer than two helped)."""
        chosen = combine(rows)
        while len(chosen) >= 2:
            name = " + ".join(r.practice for r in chosen)
            practice = Practice(name, "combination", tuple((k, v) for r in chosen for k, v in r.sets.items()),
                                "; ".join(dict.fromkeys(r.caveat for r in chosen if r.caveat)))
            try:
                (config,) = suite.with_overrides(self.req.sets + practice.set_args).expand()
            except (InputError, ValueError) as e:
                problem: str | None = str(e)
            else:
                resolved = pre_resolve(config, self.run.probes)
                problem = resolved[1] if resolved is not None else None
            if problem is not None:
                self.console.print(f"combination {name}: {problem}; without {chosen[-1].practice}", highlight=False)
                chosen = chosen[:-1]
                continue
            base = self.base
            # the baseline measured again beside it (the same hour of the machine), its rounds
            # numbered from COMBINATION_ROUNDS so that a resumed advise finds them again
            start, rounds = COMBINATION_ROUNDS, min_repeats(2 * self.final_alpha / compared)
            for k in range(start, start + rounds):
                if not (self._has(base, k) and self._has(config, k)):
                    if k > start and not self.fits(2):
                        break
                    self.measure([base, config], range(k, k + 1))
            j = replace(self.judging, alpha=self.final_alpha)
            beside = [r for r in self._of(base) if r.repeat >= start]
            return judge(practice, beside, self._of(config), j, compared)
        return None

    # --- the end ----------------------------------------------------------------------------

    def baseline_failed(self, why: str, skipped: list[Skipped]) -> int:
        self.console.print(f"[red]the baseline does not train[/red]: {self.base.config_id}: {why}", highlight=False)
        advice = {"baseline": self.base.config_id, "baseline_failed": why, "rows": [], "combination": None,
                  "best": None, "skipped": [s.__dict__ for s in skipped]}
        self.write(advice, f"# gpubench advise: {self.base.config_id}\n\nThe baseline does not train: {why}\n")
        return EXIT_BASELINE_FAILED

    def finish(self, rows: list[Row], combo: Row | None, skipped: list[Skipped]) -> int:
        helped = [r for r in rows if r.helped]
        best = None
        if combo is not None and combo.helped and combo.speedup is not None and \
                combo.speedup >= max(r.speedup or 0.0 for r in helped):
            best = combo
        elif helped:
            best = helped[0]
        undecided = budget_lines(rows, self.seconds_a_config(), self.run_dir)
        contention = contention_line(self.beside_practices())
        advice = {"baseline": self.base.config_id, "budget_s": self.req.budget_s, "elapsed_s": round(self.elapsed()),
                  "alpha": self.req.alpha, "final_alpha": self.final_alpha, "judged_on": self.judging.metric,
                  "threshold": self.judging.threshold, "loss_tolerance": self.judging.loss_tolerance,
                  "rows": [r.to_dict() for r in rows], "combination": combo.to_dict() if combo else None,
                  "best": best.to_dict() if best else None, "best_lines": suite_lines(best),
                  "skipped": [s.__dict__ for s in skipped],
                  "undecided": undecided, "contention": contention}
        self.show(rows, combo, skipped, best, [*undecided, contention], self.judging.metric)
        self.write(advice, markdown(advice))
        return EXIT_OK

    def write(self, advice: dict[str, Any], md: str) -> None:
        write_text_atomic(self.run_dir / ADVICE_JSON, json_text(advice))
        write_text_atomic(self.run_dir / ADVICE_MD, md)
        if self.req.markdown:
            write_output(self.req.markdown, md, "--markdown")
        if self.req.json:
            write_output(self.req.json, json_text(advice), "--json")

    def show(self, rows: list[Row], combo: Row | None, skipped: list[Skipped], best: Row | None,
             after: list[str], metric: str) -> None:
        """The ranked table, what does not apply, the best config, then ``after`` (the undecided
        practices' rounds and the machine's contention, as advice.json holds them)."""
        table = Table(title=f"advice for {self.base.config_id} (speed-up: {SPEEDUP[metric][0]}; its "
                            "interval's confidence: 1 - 2 alpha / the comparisons, at the look that decided it; "
                            "paired: on the per-round ratios)",
                      title_justify="left")
        for col in COLUMNS:
            table.add_column(col, overflow="fold")
        for i, r in enumerate(rows + ([combo] if combo else []), 1):
            table.add_row(*(escape(c) for c in row_cells(r, "C" if r is combo else str(i))))
        self.console.print(table)
        for line in [f"does not apply: {s.name}: {s.reason}" for s in skipped] + best_text(best, rows, metric) + after:
            if line:
                self.console.print(line, highlight=False, soft_wrap=True, markup=False)

    def seconds_a_config(self) -> float:
        """What one measurement costs here: the median wall time of the baseline's repeats
        (process start included), else the pace of this call."""
        durations = sorted(r.duration_s for r in self._of(self.base) if r.duration_s)
        return durations[len(durations) // 2] if durations else self.per_job()


def _ratio(v: float | None) -> str:
    return f"{v:.3f}x" if v is not None else "-"


def row_cells(r: Row, label: str) -> list[str]:
    level = f" ({100 * r.confidence:.3g}%" + (", paired" if r.paired else "") + ")" if r.confidence else ""
    interval = f"[{r.ci_low:.3f}, {r.ci_high:.3f}]{level}" if r.ci_low is not None and r.ci_high is not None else "-"
    memory = f"{100 * (r.memory_ratio - 1):+.0f}%" if r.memory_ratio is not None else "-"
    cold = f"{r.cold_start_ms:+.0f} ms" if r.cold_start_ms is not None else "-"
    pays = ("-" if r.payback_steps is None or not r.helped else "never" if math.isinf(r.payback_steps)
            else "at once" if r.payback_steps == 0 else f"after {math.ceil(r.payback_steps)} step(s)")
    loss = (f"{100 * (r.loss_ratio - 1):+.1f}% ({r.loss_samples:,} samples)"
            if r.loss_ratio is not None and r.loss_samples is not None else "-")
    needs = (f"likely decided after {r.rounds_needed} rounds" if r.rounds_needed is not None else
             f"not likely decided within {MAX_REPEATS} rounds" if r.verdict == "inconclusive" and r.spread is not None
             else "")
    note = "; ".join(filter(None, [r.reason, needs, r.caveat if r.helped else ""]))
    speedup = _ratio(r.speedup) + (" (undecided)" if r.verdict == "inconclusive" and r.speedup is not None else "")
    return [label, r.practice, r.verdict, speedup, interval, memory, cold, pays, loss, note]


def budget_lines(rows: list[Row], seconds_a_config: float, run_dir: Path) -> list[str]:
    """For the practices left inconclusive: the rounds each would likely need at the noise
    measured (``Row.rounds_needed``), and the line that goes on with a budget for them."""
    undecided = [r for r in rows if r.verdict == "inconclusive"]
    if not undecided:
        return []
    extra = {r.practice: max(0, r.rounds_needed - min(r.repeats)) for r in undecided if r.rounds_needed is not None}
    lines = []
    for r in undecided:
        head = f"undecided: {r.practice}, {_ratio(r.speedup)} measured over {min(r.repeats)} round(s)"
        if r.spread is None:
            lines.append(f"{head}: too few ok repeats to measure its noise")
        elif r.practice in extra:
            more = (f"about {extra[r.practice]} more round(s) would likely decide it" if extra[r.practice] else
                    "another look at more rounds would likely decide it")
            lines.append(f"{head} at {100 * r.spread:.1f}% noise a round: {more}")
        else:
            lines.append(f"{head} at {100 * r.spread:.1f}% noise a round: {MAX_REPEATS} rounds would not likely "
                         "decide it (a speed-up this close to the threshold, or noise this high, needs a quieter "
                         "machine)")
    if extra:
        # each round measures the baseline beside every practice still undecided
        seconds = (sum(extra.values()) + max(extra.values()) or len(extra) + 1) * seconds_a_config
        lines.append(f"to decide them: about {math.ceil(seconds / 60)} min more at {seconds_a_config:.0f} s a "
                     f"measurement; go on with: gpubench advise --resume {run_dir} --budget "
                     f"{math.ceil(1.25 * seconds / 60)}m")
    return lines


def contention_line(baseline: list[Result]) -> str:
    """A line where the baseline shared its cores with other processes in some round, else ""."""
    shared = [r for r in baseline if r.ok and BY_NAME["shared_cores"].value(r)]
    if not shared:
        return ""
    most = max(float(BY_NAME["others_cores"].value(r)) for r in shared)
    return (f"a shared machine: {len(shared)} of the baseline's {sum(r.ok for r in baseline)} rounds ran while other "
            f"processes used up to {most:.2g} cores; the rounds interleave the practices with the baseline, so the "
            "verdicts compare like with like, but the figures are lower than an idle machine's"
            + (" (a threads practice shows what fewer threads gain here)" if shared[0].config.get("device") == "cpu"
               else ""))


def suite_lines(best: Row | None) -> list[str]:
    """The best config's settings as suite lines (TOML, for [defaults])."""
    if best is None:
        return []
    return [f"{k} = {fmt_toml(v)}" for k, v in best.sets.items()]


def fmt_toml(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, (int, float)) else f'"{v}"'


def best_text(best: Row | None, rows: list[Row], metric: str = "throughput") -> list[str]:
    undecided = sum(r.verdict == "inconclusive" for r in rows)
    if best is None and undecided:
        return [f"best: the config as it is, for now: no practice was decided faster, and {undecided} "
                "undecided within the budget (the rounds they need below)"]
    if best is None:
        return ["best: the config as it is; no practice measured here made it faster beyond the threshold"]
    lines = [f"best: {best.practice}, {_ratio(best.speedup)} {SPEEDUP[metric][1]}; in the suite's [defaults]:"]
    lines += [f"  {line}" for line in suite_lines(best)]
    lines.append("  or: " + " ".join(f"--set {k}={v}" for k, v in best.sets.items()))
    if best.caveat:
        lines.append(f"  caveat: {best.caveat}")
    return lines


def _row(d: dict[str, Any]) -> Row:
    """A row of advice.json (``Row.to_dict``) as a Row again."""
    return Row(**{**d, "repeats": tuple(d["repeats"]),
                  "payback_steps": math.inf if d["payback_steps"] == "never" else d["payback_steps"]})


def markdown(advice: dict[str, Any]) -> str:
    """advice.md (and --markdown): the ranked table, the combination, what does not apply, the
    best config's lines."""
    metric = advice.get("judged_on") or "throughput"
    out = [f"# gpubench advise: {advice['baseline']}", "",
           f"Each practice against the baseline (speed-up: {SPEEDUP[metric][0]}, and its interval, whose confidence is "
           f"1 - 2 x {advice['alpha']:g} / 2^look / the comparisons; threshold {100 * advice['threshold']:g}%; loss "
           f"tolerance {100 * advice['loss_tolerance']:g}%), measured in {advice['elapsed_s']} s of a "
           f"{advice['budget_s']:g} s budget. Paired: judged on the ratios of the rounds, the practice's "
           "repeat against the baseline's beside it.", "",
           fmt.md_row(COLUMNS), "| " + " | ".join("---" for _ in COLUMNS) + " |"]
    for i, r in enumerate(advice["rows"], 1):
        out.append(fmt.md_row(row_cells(_row(r), str(i))))
    if advice.get("combination"):
        out.append(fmt.md_row(row_cells(_row(advice["combination"]), "C")))
    if advice.get("undecided"):
        out += ["", "## Undecided", ""] + [f"- {line}" for line in advice["undecided"]]
    if advice.get("contention"):
        out += ["", f"Note: {advice['contention']}."]
    out += ["", "## Does not apply", ""] + [f"- {s['name']}: {s['reason']}" for s in advice["skipped"]]
    best = advice.get("best")
    out += ["", "## Best config", ""]
    if best:
        out += [f"{best['practice']}: {_ratio(best['speedup'])} {SPEEDUP[metric][1]}. In the suite's "
                "`[defaults]`:", "", "```toml", *advice["best_lines"], "```"]
        if best.get("caveat"):
            out += ["", f"Caveat: {best['caveat']}"]
    else:
        out.append("The config as it is: no practice measured here made it faster beyond the threshold.")
    return "\n".join(out) + "\n"
