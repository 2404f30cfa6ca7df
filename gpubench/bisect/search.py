"""The bisection itself, apart from git and measurement: which commit to measure next against
which, what each verdict narrows, and when an inconclusive step stops the search.

``commits`` are the commits after the good revision up to the bad one (the bad one last), in
history order. The invariant: the last known good commit (index ``lo``; -1 is the good revision
given) is not slower than the good revision, the first known bad one (``hi``) is. Each step
measures the midpoint against the last known good commit with the gate: ``regressed`` moves
``hi`` to it, ``unchanged`` or ``improved`` moves ``lo`` to it; ``inconclusive`` is measured
once more (its A/B continued: more rounds, pooled with the first's, the false-alarm rate of the
two together within alpha), and where it stays inconclusive the search stops and names the
range ``commits[lo + 1 .. hi]`` instead of guessing. n commits take ceil(log2 n) steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SLOWER = ("regressed",)
NOT_SLOWER = ("unchanged", "improved")
REMEASURES = 1  # an inconclusive step is measured once more before the search stops


@dataclass
class Step:
    baseline: str  # the commit measured as the good side
    candidate: str  # the commit under test
    verdict: str  # regressed, unchanged, improved, inconclusive (or error: an A/B that could not compare)
    attempt: int = 0  # 0, then 1 for a re-measurement
    ratio: float | None = None  # candidate / baseline throughput (the worst config's)
    ci_low: float | None = None
    ci_high: float | None = None
    ab_dir: str = ""  # the A/B's run directories
    seconds: float = 0.0
    note: str = ""
    decided: str = ""  # how an A/B that was inconclusive at its threshold was decided (bisect.command)
    pooled: str = ""  # a re-measurement: the earlier A/B (its directory) whose rounds its verdict pools

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Bisection:
    good: str
    commits: list[str]  # after good, up to the bad commit (last)
    steps: list[Step] = field(default_factory=list)
    lo: int = -1
    hi: int = -1
    stopped: str = ""  # why the search stopped before naming one commit ("": it did not)

    def __post_init__(self) -> None:
        if not self.commits:
            raise ValueError("nothing to bisect: the bad revision is the good one")
        self.hi = len(self.commits) - 1

    def at(self, index: int) -> str:
        return self.good if index < 0 else self.commits[index]

    @property
    def done(self) -> bool:
        return bool(self.stopped) or self.hi - self.lo <= 1

    def next_pair(self) -> tuple[str, str, int] | None:
        """(baseline commit, candidate commit, attempt) to measure next, or None when done."""
        if self.done:
            return None
        mid = (self.lo + self.hi + 1) // 2
        base, cand = self.at(self.lo), self.at(mid)
        attempt = sum(1 for s in self.steps if (s.baseline, s.candidate) == (base, cand))
        return base, cand, attempt

    def record(self, step: Step) -> None:
        """Narrow the range by a step's verdict (the step measured ``next_pair``'s commits)."""
        pair = self.next_pair()
        if pair is None or (step.baseline, step.candidate) != pair[:2]:
            raise ValueError(f"step {step.baseline[:8]} -> {step.candidate[:8]} is not the one to measure next")
        self.steps.append(step)
        mid = self.commits.index(step.candidate)
        if step.verdict in SLOWER:
            self.hi = mid
        elif step.verdict in NOT_SLOWER:
            self.lo = mid
        elif step.attempt >= REMEASURES:
            self.stopped = (f"{step.candidate[:12]} against {step.baseline[:12]} stayed {step.verdict} after "
                            f"{step.attempt + 1} measurements")

    @property
    def culprit(self) -> str | None:
        """The first slower commit, once the range is one commit (None before, or when stopped)."""
        return self.commits[self.hi] if not self.stopped and self.hi - self.lo <= 1 else None

    @property
    def range(self) -> list[str]:
        """The commits one of which is the culprit, as far as the steps tell."""
        return self.commits[self.lo + 1:self.hi + 1]

    def to_dict(self) -> dict[str, Any]:
        return {"good": self.good, "commits": self.commits, "steps": [s.to_dict() for s in self.steps],
                "culprit": self.culprit, "range": self.range, "stopped": self.stopped}
