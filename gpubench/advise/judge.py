"""Each practice against the baseline, with the regression gate's statistics: its speed-up and
interval, its verdict (``improved`` / ``unchanged`` / ``regressed`` / ``inconclusive``), its
memory change, its cold-start cost and when it pays that back, and the quality guard (the loss
after as many samples as the baseline's). Pure functions of results, so the ranking and the
guard are tested with scripted results.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from gpubench.gate.compare import judge as gate_judge
from gpubench.gate.power import GUIDE_POWER, rounds_to_decide
from gpubench.gate.stats import min_pairs, min_repeats, paired_shift, pooled_log_sd, round_spread, shift
from gpubench.results.metrics import BY_NAME
from gpubench.results.result import Result

# how a row reads, best first: a verdict's place in the ranking
ORDER = ("improved", "unchanged", "inconclusive", "regressed", "learns worse", "target_not_reached", "diverged", "oom",
         "unsupported", "unavailable", "timeout", "error")


@dataclass(frozen=True)
class Judging:
    alpha: float  # one-sided error rate of an improved (or regressed) call, over all the practices compared
    threshold: float  # the smallest change called improved / regressed
    noise_floor: float
    loss_tolerance: float  # the loss may end this much (relative) above the baseline's and still count as learning
    # what a practice is judged on: the step rate, or with a target_loss the time to it (the
    # speed-up is then the baseline's time over the practice's: above 1, sooner)
    metric: str = "throughput"


@dataclass
class Row:
    practice: str
    group: str
    sets: dict[str, Any]
    config_id: str
    verdict: str  # improved, unchanged, inconclusive, regressed, learns worse, or a status (oom, unsupported, ...)
    reason: str = ""  # a status's reason, or what the guard saw
    speedup: float | None = None  # practice / baseline throughput, or baseline / practice time to target
    ci_low: float | None = None
    ci_high: float | None = None
    repeats: tuple[int, int] = (0, 0)  # ok repeats (baseline, practice)
    memory_ratio: float | None = None  # peak memory practice / baseline
    cold_start_ms: float | None = None  # the practice's first step minus the baseline's
    payback_steps: float | None = None  # baseline steps after which the cold start is paid back (inf: never)
    loss_ratio: float | None = None  # loss after the same samples (loss_samples), practice / baseline
    loss_samples: int | None = None  # the samples after which the losses were compared
    caveat: str = ""
    confidence: float | None = None  # of the interval: 1 - 2 alpha / the comparisons, at the look that judged it
    paired: bool = False  # judged on the per-round ratios (the practice's repeat beside the baseline's, same round)
    spread: float | None = None  # the noise of a round's ratio practice / baseline (log-sd)
    rounds_needed: int | None = None  # an inconclusive row: rounds likely to decide it at that noise (None: > 60)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["repeats"] = list(self.repeats)
        if d["payback_steps"] is not None and math.isinf(d["payback_steps"]):
            d["payback_steps"] = "never"
        return d

    @property
    def helped(self) -> bool:
        return self.verdict == "improved"


def _median(results: list[Result], metric: str) -> float | None:
    values = [v for r in results if r.ok and isinstance(v := BY_NAME[metric].value(r), (int, float))
              and math.isfinite(v)]
    return statistics.median(values) if values else None


def judge(practice: Any, baseline: list[Result], results: list[Result], j: Judging, compared: int) -> Row:
    """One practice's row; ``compared``: how many comparisons share ``j.alpha`` (Bonferroni)."""
    config_id = results[0].config_id if results else getattr(practice, "config_id", "")
    row = Row(practice.name, practice.group, dict(practice.sets), config_id, "inconclusive", caveat=practice.caveat)
    ok = [r for r in results if r.ok]
    missed = [r for r in results if r.status == "target_not_reached"]
    if missed:  # a practice that does not reach the quality in every trial is no faster way to it
        row.verdict = "target_not_reached"
        row.reason = f"{len(missed)} of {len(results)} repeats: {missed[0].reason}"
        return row
    if not ok:
        first = next((r for r in results if r.status != "ok"), None)
        row.verdict = first.status if first is not None else "inconclusive"
        row.reason = first.reason if first is not None else "not measured (the budget was spent)"
        return row
    base_ok = [r for r in baseline if r.ok]
    if not base_ok:
        row.reason = "the baseline has no ok repeat to compare with"
        return row
    level = 2 * j.alpha / max(1, compared)  # the two-sided level of each practice's interval
    row.confidence = 1 - level
    # the practice and the baseline ran in the same rounds (the order turning): like ``ab
    # --lockstep``, each round's ratio cancels what drifted between rounds (the machine's state),
    # so the rounds are compared paired wherever enough of them pair up
    metric = BY_NAME[j.metric]
    by_round = {r.repeat: r for r in base_ok}
    pairs = [(by_round[r.repeat], r) for r in ok if r.repeat in by_round]
    pb, pp = [float(metric.value(b)) for b, _ in pairs], [float(metric.value(p)) for _, p in pairs]
    if len(pairs) >= min_pairs(level):
        row.paired = True
        s = paired_shift(pb, pp, level)
    else:
        s = shift([float(metric.value(r)) for r in base_ok], [float(metric.value(r)) for r in ok], level)
    # the noise of a round's ratio: measured on the pairs, else from each side's spread (two
    # independent values: sqrt 2 times one's)
    if len(pairs) >= 2:
        row.spread = round_spread(pb, pp)
    elif (pooled := pooled_log_sd([[float(metric.value(r)) for r in rs] for rs in (base_ok, ok)])) is not None:
        row.spread = pooled * math.sqrt(2)
    row.verdict = gate_judge(s, metric, j.threshold, j.noise_floor)
    # the speed-up reads "above 1: better" whatever the metric: a time's ratio is turned over
    up = metric.higher_is_better
    row.speedup = s.ratio if up else 1 / s.ratio
    if s.has_ci:
        row.ci_low, row.ci_high = (s.ci_low, s.ci_high) if up else (1 / s.ci_high, 1 / s.ci_low)
    row.repeats = (len(base_ok), len(ok))
    if not s.has_ci:
        row.reason = (f"{len(base_ok)} and {len(ok)} repeats: too few for an interval (needs {min_repeats(level)} "
                      "a side)")
    mem_b, mem_p = _median(base_ok, "peak_memory_bytes"), _median(ok, "peak_memory_bytes")
    row.memory_ratio = mem_p / mem_b if mem_b and mem_p else None
    # a time to a quality holds the cold start and the quality itself: no payback, no loss guard
    rate = j.metric == "throughput"
    cold_b, cold_p = _median(base_ok, "cold_start_ms"), _median(ok, "cold_start_ms")
    if rate and cold_b is not None and cold_p is not None:
        row.cold_start_ms = cold_p - cold_b
        row.payback_steps = payback(cold_p - cold_b, _median(base_ok, "step_ms"), _median(base_ok, "samples_per_step"),
                                    _median(ok, "throughput"))
    _guard(row, base_ok, ok, results, j.loss_tolerance if rate else None)
    return row


def guide(row: Row, alpha_config: float, j: Judging) -> None:
    """An inconclusive row's ``rounds_needed``: the rounds after which a practice whose true
    speed-up is the one measured would likely (gate.power.GUIDE_POWER) be decided, paired
    (advise's rounds measure the practice beside the baseline), at the noise of its rounds and
    the next look's one-sided level ``alpha_config``."""
    if row.verdict != "inconclusive" or row.speedup is None or row.spread is None:
        return
    row.rounds_needed = rounds_to_decide(row.spread, row.speedup, alpha_config, j.threshold, j.noise_floor,
                                         paired=True, power=GUIDE_POWER)


def payback(extra_cold_ms: float, base_step_ms: float | None, base_samples: float | None,
            rate: float | None) -> float | None:
    """Baseline steps (of its samples) after which a practice's extra cold start is paid back by
    its faster steps: extra / (baseline step - the practice's time for the same samples); 0 when
    it starts no slower, inf when its steps are not faster; None where a figure is missing."""
    if base_step_ms is None or base_samples is None or not rate:
        return None
    if extra_cold_ms <= 0:
        return 0.0
    saved = base_step_ms - base_samples * 1000.0 / rate
    return extra_cold_ms / saved if saved > 0 else math.inf


# the guard's loss of a repeat: the mean over its steps that end in the last tenth of the samples
# compared (one step's loss is one batch's; the mean of a span is steadier, and the same span for both)
GUARD_SPAN = 0.1


def trained_samples(result: Result) -> int | None:
    """The samples ``result`` trained on, step by step from its first (cold start, warm-up and
    windows): len(its loss curve) x samples_per_step; None without a curve."""
    curve, per = result.get("metrics", "loss", "curve"), result.get("metrics", "samples_per_step")
    return len(curve) * int(per) if curve and per else None


def loss_at(result: Result, samples: int) -> float | None:
    """``result``'s loss after ``samples`` samples: the mean loss of its steps that end in the
    last GUARD_SPAN of them (at least the step that ends at or just before ``samples``); None
    without a curve or when its first step ends after ``samples``."""
    curve, per = result.get("metrics", "loss", "curve"), result.get("metrics", "samples_per_step")
    if not curve or not per:
        return None
    last = min(len(curve), samples // int(per))  # 1-based: the last step that ends within `samples`
    first = min(last, int(samples * (1 - GUARD_SPAN)) // int(per) + 1)
    values = [v for v in curve[first - 1:last] if isinstance(v, (int, float))]
    return statistics.fmean(values) if last >= 1 and values else None


def _guard(row: Row, base_ok: list[Result], ok: list[Result], results: list[Result], tolerance: float | None
           ) -> None:
    """The training-quality guard: a practice that diverges, or whose loss after the same number
    of samples as the baseline's (the fewest any repeat of the two trained) ends above the
    baseline's by more than the tolerance, is never recommended. Never after the same time or
    the same windows: a faster config takes more steps in a time-bounded window. ``tolerance``
    None: divergence only (judged on the time to a target, the quality is in the figure)."""
    diverged = [r for r in results if r.status == "diverged"]
    if diverged:
        row.verdict, row.reason = "diverged", f"{len(diverged)} of {len(results)} repeats: {diverged[0].reason}"
        return
    if tolerance is None:
        return
    trained = [trained_samples(r) for r in (*base_ok, *ok)]
    if not trained or None in trained:
        return  # a result without a loss curve (recorded before it was kept): no comparison
    samples = min(t for t in trained if t is not None)
    at_b, at_p = ([v for r in side if (v := loss_at(r, samples)) is not None] for side in (base_ok, ok))
    if not at_b or not at_p:
        return
    loss_b, loss_p = statistics.median(at_b), statistics.median(at_p)
    if loss_b <= 0 or not math.isfinite(loss_b) or not math.isfinite(loss_p):
        return
    row.loss_ratio, row.loss_samples = loss_p / loss_b, samples
    if row.loss_ratio > 1 + tolerance:
        row.reason = (f"loss after the same {samples:,} samples {loss_p:.4g} against the baseline's {loss_b:.4g} "
                      f"(+{100 * (row.loss_ratio - 1):.1f}%, above the tolerance of {100 * tolerance:g}%)")
        row.verdict = "learns worse"


def rank(rows: list[Row]) -> list[Row]:
    """Best first: by verdict (improved, unchanged, inconclusive, regressed, then what failed),
    then by speed-up."""
    return sorted(rows, key=lambda r: (ORDER.index(r.verdict) if r.verdict in ORDER else len(ORDER),
                                       -(r.speedup or 0.0), r.practice))


def combine(rows: list[Row]) -> list[Row]:
    """The practices to combine: every one that helped, the fastest of each group (practices of
    a group exclude one another), fastest first."""
    best: dict[str, Row] = {}
    for r in rank(rows):
        if r.helped and r.group not in best:
            best[r.group] = r
    return sorted(best.values(), key=lambda r: -(r.speedup or 0.0))
