"""``gpubench bisect``: from a slowdown between two revisions to the commit that caused it.

First the ends: the bad revision against the good one, with ``gpubench ab --lockstep`` (the
two sides' workers taking turns on one machine, rounds compared paired, more rounds while
undecided within ``--budget``). If the slowdown does not reproduce there, nothing is bisected
(exit 1). Then each step measures the midpoint of the remaining range against the last known
good commit the same way (gpubench.bisect.search), in detached worktrees kept in a cache (each
side imports its own checkout: gpubench's own, or the user's project whose model the suite
names), until one commit is left. Every step's A/B is a pair of run directories on disk, and
``bisect.json`` records each verdict as it is made: Ctrl-C keeps them, ``--resume DIR`` goes on.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console

from gpubench import fmt
from gpubench.bisect import git
from gpubench.bisect.search import Bisection, Step
from gpubench.errors import EXIT_NOT_NAMED, EXIT_OK, InputError, stop_exit_code, stop_message
from gpubench.files import read_user_text, write_text_atomic
from gpubench.gate import ALPHA, NOISE_FLOOR, THRESHOLD
from gpubench.gate.compare import parse_fraction, repeats_for
from gpubench.launch import Interpreter
from gpubench.results.outputs import check_output_dir, check_output_file, write_output
from gpubench.results.store import json_text, locked_run_dir
from gpubench.runner import ab
from gpubench.suite import load_suite

STATE = "bisect.json"


@dataclass
class BisectRequest:
    suite: str = ""
    good: str = ""
    bad: str = ""
    repo: Path = Path(".")
    sets: list[str] = field(default_factory=list)
    out: Path = Path("runs")
    cache: Path = Path(".gpubench") / "worktrees"
    repeats: int = 10  # lockstep rounds of each A/B's first look
    budget_s: float = 300.0  # each A/B: more rounds while undecided, within this time
    threshold: str = "auto"  # auto: the ends at 3%, then each step at half the slowdown the ends measured
    noise_floor: str = NOISE_FLOOR
    alpha: float = ALPHA
    setup: str = ""  # a command that makes each worktree's environment (run once per dependency hash)
    markdown: Path | None = None
    json: Path | None = None
    resume: Path | None = None


KEPT = ("suite", "good", "bad", "repo", "sets", "cache", "repeats", "budget_s", "threshold", "noise_floor", "alpha",
        "setup")


def execute_bisect(req: BisectRequest, console: Console) -> int:
    """The bisection; its exit code (0 a commit named, 1 none: not reproduced at the ends, or a
    step that stayed inconclusive). Bad input raises InputError (exit 2) before anything runs."""
    state: dict[str, Any] = {}
    if req.resume is not None:
        try:
            state = json.loads(read_user_text(req.resume / STATE, "--resume"))
            for k in KEPT:
                if k in state["request"]:
                    setattr(req, k, Path(state["request"][k]) if k in ("repo", "cache") else state["request"][k])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InputError(f"--resume {req.resume}: no readable {STATE} ({type(e).__name__}); resume a directory "
                             "gpubench bisect made") from None
    repo = git.toplevel(Path(state["repo"]) if state else req.repo)
    if state:  # the commits it was started with, whatever the branches' names point to now
        good, bad = state["good"], state["bad"]
    else:
        good, bad = git.resolve(repo, req.good, "--good"), git.resolve(repo, req.bad, "--bad")
    commits = git.commits_between(repo, good, bad)
    suite_path = Path(req.suite).resolve() if Path(req.suite).is_file() else None
    configs = load_suite(req.suite).with_overrides(req.sets).expand()  # a bad suite or --set: exit 2 now
    rel = _suite_in(repo, suite_path) if suite_path is not None else None
    if rel is not None and not git.has_file(repo, good, rel):
        raise InputError(f"{req.suite}: not in the good revision {good[:12]} (each step reads the suite as the "
                         "last good commit has it); commit it there, or give a suite outside the repository")
    if req.threshold != "auto":
        parse_fraction(req.threshold, "--threshold")
    parse_fraction(req.noise_floor, "--noise-floor")

    needed = repeats_for(ab.look_alpha(req.alpha, 1), len(configs), "bonferroni", paired=True)
    if req.repeats < needed:
        raise InputError(f"--repeats {req.repeats}: a lockstep A/B of {len(configs)} config(s) at alpha {req.alpha:g} "
                         f"(its first look at {ab.look_alpha(req.alpha, 1):g}) needs at least {needed} rounds")
    for path, option in ((req.markdown, "--markdown"), (req.json, "--json")):
        check_output_file(path, option)
    if req.resume is None:
        check_output_dir(req.out, "--out")
        run_dir = req.out / f"bisect-{good[:8]}-{bad[:8]}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
        run_dir.mkdir(parents=True)
    else:
        run_dir = req.resume
    with locked_run_dir(run_dir):
        session = _Session(req, console, repo, run_dir, rel, good, bad, commits, state)
        try:
            return session.run()
        except KeyboardInterrupt as e:
            stop_message(e, f"every finished step is in {run_dir / STATE}; go on with: gpubench bisect --resume "
                            f"{run_dir}")
            return stop_exit_code(e)


def _suite_in(repo: Path, suite: Path) -> str | None:
    """The suite's path inside the repository (each step reads the copy of its last good commit,
    whose directory each side maps to its own worktree for the model's code), or None for a
    suite outside it (read as it is)."""
    try:
        return str(suite.relative_to(repo.resolve()))
    except ValueError:
        return None


class _Session:
    def __init__(self, req: BisectRequest, console: Console, repo: Path, run_dir: Path, suite_rel: str | None,
                 good: str, bad: str, commits: list[str], state: dict[str, Any]) -> None:
        self.req, self.console, self.repo, self.run_dir, self.suite_rel = req, console, repo, run_dir, suite_rel
        self.good, self.bad = good, bad
        self.bisection = Bisection(good, commits)
        self.ends: list[Step] = [Step(**s) for s in state.get("ends", [])]
        self.confirm: list[Step] = []  # the culprit against its parent (measured again if inconclusive)
        self.stored_confirm = [Step(**s) for s in state.get("confirm_steps", [])]
        self.done_steps = [Step(**s) for s in state.get("steps", [])]
        self.cache = req.cache if req.cache.is_absolute() else Path.cwd() / req.cache
        self.t0 = time.monotonic()

    def save(self) -> None:
        write_text_atomic(self.run_dir / STATE, json_text({
            "request": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.req).items() if k in KEPT},
            "repo": str(self.repo), "good": self.good, "bad": self.bad,
            "ends": [s.to_dict() for s in self.ends], "confirm_steps": [s.to_dict() for s in self.confirm],
            **self.bisection.to_dict()}))

    def side(self, sha: str) -> Interpreter:
        """How the side of ``sha`` runs: its worktree and Python."""
        return git.checkout(self.repo, sha, self.cache, self.req.setup, self.run_dir / "setup.log")

    def against_the_ends(self, step: Step) -> Step:
        """An inconclusive step whose interval still tells which end the midpoint is at: its
        whole interval above the ends' whole interval (faster than the bad commit measured, its
        uncertainty counted: on the good side), or below 1 - the noise floor (slower than the
        good level: on the bad side). The search looks for one step of the ends' size, so that is
        a decision, not a guess; an interval that reaches either is measured again."""
        end = self.ends[-1] if self.ends else None
        bad_level = (end.ci_high if end.ci_high is not None else end.ratio) if end is not None else None
        if step.verdict != "inconclusive" or bad_level is None or step.ci_low is None or step.ci_high is None:
            return step
        floor = parse_fraction(self.req.noise_floor, "--noise-floor")
        if step.ci_low > bad_level and step.ci_high >= 1 - floor:
            step.verdict = "unchanged"
            step.decided = (f"against the ends: its interval lies above the ends' interval (up to x{bad_level:.3f}), "
                            "the bad level")
        elif step.ci_high < 1 - floor:
            step.verdict = "regressed"
            step.decided = f"against the ends: its interval lies below 1 - the noise floor ({100 * floor:g}%)"
        return step

    def step_threshold(self) -> str:
        """The threshold of an A/B: the one given; with ``auto``, 3% for the ends, then half the
        slowdown the ends measured (at least 2%): a step is the slowdown being looked for, so a
        midpoint within half of it is on the good side, and one past half of it on the bad."""
        if self.req.threshold != "auto":
            return self.req.threshold
        ratio = self.ends[-1].ratio if self.ends and self.ends[-1].verdict == "regressed" else None
        if ratio is None:
            return THRESHOLD
        return f"{max(2.0, 50 * (1 - ratio)):.2f}%"

    def measure(self, base: str, cand: str, attempt: int, label: str) -> Step:
        """One A/B of ``cand`` against ``base`` (or the step recorded earlier, on --resume)."""
        earlier = next((s for s in self.done_steps + self.stored_confirm + self.confirm
                        if (s.baseline, s.candidate, s.attempt) == (base, cand, attempt)), None)
        if earlier is not None:
            return earlier
        baseline, candidate = self.side(base), self.side(cand)
        suite = str(Path(str(baseline.pythonpath)) / self.suite_rel) if self.suite_rel is not None else self.req.suite
        out = self.run_dir / "steps" / f"{label}-{cand[:8]}-vs-{base[:8]}-{attempt}"
        verdicts = out / "ab.json"
        # measured again: the earlier A/B continued, its rounds pooled and its looks counted on (a
        # second A/B judged alone would spend alpha again, and a noisy first half would be lost)
        first = next((s for s in self.bisection.steps + self.ends + self.confirm
                      if (s.baseline, s.candidate, s.attempt) == (base, cand, attempt - 1)), None) if attempt else None
        prior = None
        if first is not None:  # its directory under this bisection's, wherever the bisection was started from
            prior = self.run_dir / "steps" / Path(first.ab_dir).name / "ab.json"
            if first.verdict != "inconclusive" or not _undecided(prior):
                self.console.print(f"{label}: the earlier A/B ({first.verdict}) left no undecided look to continue; "
                                   "measured afresh, at alpha again", highlight=False, markup=False)
                prior = None
        subject = git.git(self.repo, "show", "-s", "--format=%s", cand)
        self.console.print(f"{label}: {cand[:12]} ({subject}) against {base[:12]}"
                           + (f", measured again ({attempt + 1})" if attempt else ""), highlight=False, markup=False)
        t0 = time.monotonic()
        ab.execute_ab(ab.ABRequest(suite=suite, baseline=baseline, candidate=candidate, out=out, sets=self.req.sets,
                                   repeats=self.req.repeats, threshold=self.step_threshold(),
                                   noise_floor=self.req.noise_floor,
                                   alpha=self.req.alpha, json=verdicts, report=False, lockstep=True,
                                   budget_s=self.req.budget_s, prior=prior), self.console)
        step = _step_of(verdicts, base, cand, attempt, str(out), time.monotonic() - t0)
        if prior is not None:
            step.pooled = str(prior.parent)
        if label != "ends":
            step = self.against_the_ends(step)
        self.console.print(f"{label}: {cand[:12]} {step.verdict}" + (f", {_change(step)}" if step.ratio else ""),
                           highlight=False)
        return step

    def run(self) -> int:
        n = len(self.bisection.commits)
        steps = math.ceil(math.log2(n)) if n > 1 else 0
        self.console.print(f"bisect {self.good[:12]}..{self.bad[:12]}: {n} commit(s), {steps} step(s) after the "
                           f"ends -> {self.run_dir}", highlight=False)
        # the ends: does the slowdown reproduce?
        while not self.ends or (self.ends[-1].verdict not in ("regressed", "unchanged", "improved")
                                and len(self.ends) <= 1):
            step = self.measure(self.good, self.bad, len(self.ends), "ends")
            self.ends.append(step)
            self.save()
        if self.ends[-1].verdict != "regressed":
            why = (f"the bad revision is {self.ends[-1].verdict} against the good one"
                   + (f" ({_change(self.ends[-1])})" if self.ends[-1].ratio else ""))
            return self.finish(f"the slowdown did not reproduce at the ends: {why}; nothing to bisect")
        while (pair := self.bisection.next_pair()) is not None:
            base, cand, attempt = pair
            step = self.measure(base, cand, attempt, f"step {len(self.bisection.steps) + 1}")
            self.bisection.record(step)
            self.save()
        if self.bisection.culprit is None:
            shown = ", ".join(c[:12] for c in self.bisection.range)
            return self.finish(f"{self.bisection.stopped}; the culprit is one of: {shown}")
        culprit, parent = self.bisection.culprit, self.bisection.at(self.bisection.lo)
        measured = self._culprit_step()
        if measured is None or measured.baseline != parent:
            # the culprit was found slower than an older good commit: its own A/B against its
            # parent is the slowdown it made (drift within the threshold can add up over steps)
            self.confirm = [self.measure(parent, culprit, 0, "confirm")]
            self.save()
            if self.confirm[-1].verdict == "inconclusive":  # measured once more, as a step is
                self.confirm.append(self.measure(parent, culprit, 1, "confirm"))
                self.save()
        return self.finish("")

    def _culprit_step(self) -> Step | None:
        """The step (or ends) that found the culprit slower."""
        culprit = self.bisection.culprit
        return next((s for s in reversed(self.bisection.steps + self.ends)
                     if s.candidate == culprit and s.verdict == "regressed"), None)

    def finish(self, not_named: str) -> int:
        culprit = self.bisection.culprit if not not_named else None
        out: dict[str, Any] = {"good": self.good, "bad": self.bad, "repo": str(self.repo),
                               "seconds": round(time.monotonic() - self.t0), "ends": [s.to_dict() for s in self.ends],
                               **self.bisection.to_dict(), "culprit": culprit, "named": culprit is not None,
                               "why_not": not_named}
        if culprit is not None:
            out["culprit_info"] = git.describe(self.repo, culprit)
            out["parent"] = self.bisection.at(self.bisection.lo)
            found = self._culprit_step()
            confirm = self.confirm[-1] if self.confirm else None
            measured = confirm if confirm is not None and confirm.ratio is not None else found
            out["slowdown"] = measured.to_dict() if measured else None
            out["triage"] = _triage(measured)
            out["confirm"] = confirm.to_dict() if confirm is not None else None
            if confirm is not None and confirm.verdict != "regressed":
                out["warning"] = (f"against its parent {confirm.baseline[:12]} the culprit measured {confirm.verdict}"
                                  + (f" ({_change(confirm)})" if confirm.ratio else "")
                                  + (f", though slower than {found.baseline[:12]} ({_change(found)})" if found else "")
                                  + ": the slowdown may be spread over several commits of the range")
        self.save()
        md = markdown(out)
        write_text_atomic(self.run_dir / "bisect.md", md)
        if self.req.markdown:
            write_output(self.req.markdown, md, "--markdown")
        if self.req.json:
            write_output(self.req.json, json_text(out), "--json")
        for line in md.splitlines():
            self.console.print(line, highlight=False, markup=False, soft_wrap=True)
        return EXIT_OK if culprit is not None else EXIT_NOT_NAMED


def _undecided(ab_json: Path) -> bool:
    """Whether an A/B's JSON ends on a look with a config undecided (``ab --continue`` goes on
    only with such an A/B)."""
    try:
        looks = json.loads(ab_json.read_text())["looks"]
        return bool(looks) and int(looks[-1]["undecided"]) > 0
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False


def _step_of(verdicts: Path, base: str, cand: str, attempt: int, ab_dir: str, seconds: float) -> Step:
    """A step's verdict from its A/B's JSON: regressed if any config regressed; unchanged or
    improved where every config was; else inconclusive (or error, when the A/B compared
    nothing). Its figure is the slowest config's ratio."""
    try:
        ab = json.loads(verdicts.read_text())
    except (OSError, ValueError):
        return Step(base, cand, "error", attempt, ab_dir=ab_dir, seconds=seconds,
                    note="the A/B wrote no verdicts (see its run directories)")
    vs = [v for v in ab.get("verdicts", []) if v.get("ratio") is not None]
    if not vs:
        return Step(base, cand, "error", attempt, ab_dir=ab_dir, seconds=seconds, note="no config compared")
    worst = min(vs, key=lambda v: v["ratio"])
    kinds = {v["verdict"] for v in vs}
    verdict = ("regressed" if "regressed" in kinds else "inconclusive" if kinds - {"unchanged", "improved"}
               else "improved" if kinds == {"improved"} else "unchanged")
    triage = ab.get("triage")
    return Step(base, cand, verdict, attempt, worst["ratio"], worst.get("ci_low"), worst.get("ci_high"), ab_dir,
                seconds, note=json.dumps(triage)[:2000] if triage else "")


def _change(step: Step) -> str:
    ci = (f" [{fmt.ratio(step.ci_low)}, {fmt.ratio(step.ci_high)}]" if step.ci_low is not None
          and step.ci_high is not None else "")
    return f"throughput {100 * ((step.ratio or 1) - 1):+.1f}%{ci} (x{step.ratio:.3f})"


def _triage(step: Step | None) -> Any:
    if step is None or not step.note:
        return None
    try:
        return json.loads(step.note)
    except ValueError:
        return step.note


def markdown(out: dict[str, Any]) -> str:
    lines = [f"# gpubench bisect {out['good'][:12]}..{out['bad'][:12]}", ""]
    if out["named"]:
        info = out["culprit_info"]
        lines += [f"**Culprit: {info['commit'][:12]}** {info['subject']}", "",
                  f"- author: {info['author']}, {info['date']}"]
        s = out.get("slowdown")
        if s:
            lines.append(f"- slowdown: {_change(Step(**s))}, against {s['baseline'][:12]}"
                         + (" (its parent)" if s["baseline"] == out.get("parent") else "")
                         + f" (A/B: {s['ab_dir']})")
        if out.get("warning"):
            lines.append(f"- **warning**: {out['warning']}")
        if out.get("triage"):
            lines.append(f"- triage of the A/B: {json.dumps(out['triage'])[:600]}")
        lines += ["", "```", info["diffstat"], "```"]
    else:
        lines += [f"No commit named: {out['why_not']}"]
    lines += ["", "| step | candidate | against | verdict | change | seconds |",
              "| --- | --- | --- | --- | --- | --- |"]
    for label, s in ([("ends", e) for e in out["ends"]] + [(str(i), st) for i, st in enumerate(out["steps"], 1)]
                     + [("confirm", c) for c in ([out["confirm"]] if out.get("confirm") else [])]):
        step = Step(**s)
        verdict = (step.verdict + (" (with the rounds before it)" if step.pooled else "")
                   + (f" ({step.decided})" if step.decided else ""))
        lines.append(f"| {label} | {step.candidate[:12]} | {step.baseline[:12]} | {verdict} | "
                     f"{_change(step) if step.ratio else '-'} | {step.seconds:.0f} |")
    lines += ["", f"{len(out['commits'])} commit(s), {len(out['steps'])} step(s) after the ends, {out['seconds']} s."]
    return "\n".join(lines) + "\n"
