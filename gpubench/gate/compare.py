"""Per-config verdicts between a baseline and a current set of results.

For every config (matched by config_id) the repeats of each side give a shift of the metric
(``gate.stats.shift``). ``alpha`` is the one-sided error rate of a ``regressed`` (and,
separately, of an ``improved``) call over all configs compared: each config's interval is the
two-sided 1 - 2 alpha / K interval, K the number of configs compared (Bonferroni), so each of
its ends is a one-sided bound at alpha / K. With T the threshold and F the noise floor, in the
direction where larger is better:

- ``regressed``: the whole CI is below 1 - F and the point estimate at or below 1 - T;
- ``improved``: the whole CI is above 1 + F and the point estimate at or above 1 + T;
- ``inconclusive``: no verdict, and the CI reaches beyond 1 - T or 1 + T (or there are too
  few repeats for an interval);
- ``unchanged``: the CI lies within (1 - T, 1 + T);
- ``missing`` / ``new``: no ok repeat on the current / baseline side.

A slowdown of exactly T is caught about half the time (its point estimate falls on either
side of T), so T should sit below the smallest slowdown that must be caught.

``correction = "bh"`` controls the false-discovery rate instead (Benjamini-Hochberg): for each
config the one-sided p-value of "no regression beyond F" (and, separately, of "no improvement
beyond F") comes from the same Mann-Whitney test whose inversion gives the interval; BH at
``alpha`` over the K configs picks the flagged ones in each direction, and every interval is
then reported at the one-sided level alpha R / K, R the number flagged (at least 1): the
false-coverage-rate interval of Benjamini and Yekutieli, so a flagged regression's interval
lies below 1 - F. A regression is ``regressed`` when BH flagged it and its point estimate is at
or below 1 - T (improvements alike); the rest are ``unchanged`` or ``inconclusive`` as above.
Of the verdicts ``regressed``, at most a share alpha is false on average, where Bonferroni
bounds the chance of any false one: on a sweep of dozens of configs BH finds more of the real
changes for the same alpha.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from gpubench.errors import InputError, did_you_mean
from gpubench.gate.stats import (
    Shift,
    benjamini_hochberg,
    min_pairs,
    min_repeats,
    p_below,
    paired_p_below,
    paired_shift,
    pooled_log_sd,
    round_spread,
    shift,
)
from gpubench.results.metrics import GATE_METRICS, Metric, gate_metric_names, median_to_target
from gpubench.results.result import Result
from gpubench.results.schema import dig

VERDICTS = ("regressed", "improved", "unchanged", "inconclusive", "missing", "new")
# --correction: what alpha bounds across the configs compared
CORRECTIONS = ("bonferroni", "bh")  # bonferroni: the familywise error rate; bh: the false discovery rate


def parse_fraction(text: str, option: str) -> float:
    """``5%``, ``0.05`` -> 0.05; anything else is an InputError naming the option."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%?)\s*", text)
    if not m:
        raise InputError(f"{option} {text}: expected a percentage such as 5% or a fraction such as 0.05")
    value = float(m.group(1)) / (100 if m.group(2) else 1)
    if not 0 <= value < 1:
        raise InputError(f"{option} {text}: must be at least 0% and below 100%")
    return value


@dataclass(frozen=True)
class GateOptions:
    threshold: float
    noise_floor: float
    alpha: float
    metric: str
    correction: str = "bonferroni"
    best_of: int = 1


def repeats_for(alpha: float, configs: int, correction: str, paired: bool = False, best_of: int = 1) -> int:
    """Fewest repeats a side (rounds, when ``paired``) for which a config can get a verdict:
    Bonferroni splits alpha over the configs; under Benjamini-Hochberg one config can be
    flagged at alpha itself. With ``best_of`` k, k rounds make one pair."""
    level = 2 * alpha / (1 if correction == "bh" else max(1, configs))
    return best_of * min_pairs(level) if paired else min_repeats(level)


def gate_options(threshold: str, noise_floor: str, alpha: float, metric: str,
                 correction: str = "bonferroni", best_of: int = 1) -> GateOptions:
    """The gate's command-line options, checked: ``compare`` and ``ab`` share this, and call it
    before they load or run anything."""
    if correction not in CORRECTIONS:
        raise InputError(f"--correction {correction}: expected one of: {', '.join(CORRECTIONS)}")
    options = GateOptions(parse_fraction(threshold, "--threshold"), parse_fraction(noise_floor, "--noise-floor"),
                          alpha, metric, correction, best_of)
    if best_of < 1:
        raise InputError(f"--best-of {best_of}: must be at least 1")
    if options.noise_floor > options.threshold:
        raise InputError(f"--noise-floor {noise_floor} is above --threshold {threshold}")
    if not 0 < alpha < 1:
        raise InputError(f"--alpha {alpha:g}: must be between 0 and 1")
    if metric not in GATE_METRICS:
        raise InputError(f"--metric {metric}{did_you_mean(metric, GATE_METRICS)}: expected one of: "
                         f"{', '.join(gate_metric_names())}")
    return options


@dataclass(frozen=True)
class ConfigVerdict:
    config_id: str
    verdict: str
    ratio: float | None  # current / baseline of the metric
    ci_low: float | None
    ci_high: float | None
    baseline_median: float | None
    current_median: float | None
    n_baseline: int
    n_current: int
    note: str = ""
    # between-process spread: pooled sd of the log values within each side; paired: the sd of
    # the rounds' log ratios
    noise: float | None = None


@dataclass(frozen=True)
class Comparison:
    metric: Metric
    threshold: float
    noise_floor: float
    alpha: float
    alpha_per_config: float  # the one-sided level of each config's interval
    verdicts: list[ConfigVerdict]
    correction: str = "bonferroni"
    paired: bool = False  # lockstep rounds, judged on the per-round ratios
    best_of: int = 1  # paired: each side's best of k consecutive rounds makes one pair

    @property
    def regressed(self) -> list[ConfigVerdict]:
        return [v for v in self.verdicts if v.verdict == "regressed"]

    def counts(self) -> dict[str, int]:
        return {k: n for k in VERDICTS if (n := sum(v.verdict == k for v in self.verdicts))}

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric.name, "unit": self.metric.unit, "bigger_is_better": self.metric.higher_is_better,
                "threshold": self.threshold, "noise_floor": self.noise_floor, "alpha": self.alpha,
                "alpha_per_config": self.alpha_per_config, "correction": self.correction, "paired": self.paired,
                "best_of": self.best_of,
                "counts": self.counts(),
                "verdicts": [asdict(v) for v in self.verdicts]}


def _usable(r: Result, metric: Metric) -> float | None:
    """The metric of an ok repeat, where it has a positive one (the gate works on its log)."""
    v = metric.value(r) if r.ok else None
    if v is not None and metric.floor is not None and 0 <= v < metric.floor:
        return metric.floor
    return float(v) if v is not None and v > 0 else None


def _missed(r: Result, metric: Metric) -> bool:
    """A repeat that trained to a target and missed it, for a metric of the time to it."""
    return metric.combine == "to_target" and r.status == "target_not_reached"


def _censored(results: list[Result], metric: Metric) -> dict[str, float]:
    """config_id -> what a repeat that missed the target counts as, for a metric of the time to
    it (none for other metrics): just past every repeat of the config that reached it and every
    point where one that missed stopped, on either side, so that ranks put a missed repeat behind
    every reached one (MLPerf's rule, the summary's) and the missed tie among themselves."""
    if metric.combine != "to_target":
        return {}
    worst: dict[str, float] = {}
    for r in results:
        v = _usable(r, metric) if r.ok else r.get(*metric.stop) if _missed(r, metric) else None
        if v is not None and v > 0:
            worst[r.config_id] = max(worst.get(r.config_id, 0.0), float(v))
    return {k: v * (1 + 1e-6) for k, v in worst.items()}


def _value(r: Result, metric: Metric, censored: dict[str, float]) -> float | None:
    """A repeat's value in the gate: an ok repeat's metric, a missed target's censored value."""
    return censored.get(r.config_id) if _missed(r, metric) else _usable(r, metric)


def _values(results: list[Result], metric: Metric, censored: dict[str, float]) -> dict[str, list[float]]:
    """config_id -> the value of each measured repeat (configs with none map to [])."""
    out: dict[str, list[float]] = {}
    for r in results:
        values = out.setdefault(r.config_id, [])
        if (v := _value(r, metric, censored)) is not None:
            values.append(v)
    return out


def _pairs(baseline: list[Result], current: list[Result], metric: Metric, censored: dict[str, float],
           best_of: int = 1) -> dict[str, tuple[list[float], list[float]]]:
    """config_id -> (baseline, current) values of the repeats measured on both sides, matched by
    repeat number (the rounds of a lockstep A/B). With ``best_of`` k, each run of k such rounds
    (in repeat order; an incomplete last run is left out) gives one pair: each side's best
    value of the k."""
    def by_repeat(results: list[Result]) -> dict[tuple[str, int], float]:
        return {(r.config_id, r.repeat): v for r in results if (v := _value(r, metric, censored)) is not None}

    b, c = by_repeat(baseline), by_repeat(current)
    out: dict[str, tuple[list[float], list[float]]] = {}
    for key in sorted(b.keys() & c.keys()):
        pair = out.setdefault(key[0], ([], []))
        pair[0].append(b[key])
        pair[1].append(c[key])
    if best_of > 1:
        best = max if metric.higher_is_better else min
        out = {k: tuple([best(v[i: i + best_of]) for i in range(0, len(v) - best_of + 1, best_of)]  # type: ignore[misc]
                        for v in pair) for k, pair in out.items()}
    return out


def _median(values: list[float], censored: float | None) -> float | None:
    """A side's figure as the report and the exports give it: the median of its repeats (to a
    target: with a missed repeat slower than any that reached it, none where half or more
    missed)."""
    if censored is None:
        return float(statistics.median(values)) if values else None
    return median_to_target([v for v in values if v != censored], sum(v == censored for v in values))


def _some(values: dict[str, list[float]]) -> str:
    first = next(iter(values))
    return f"{len(values)}: {first}" + (", ..." if len(values) > 1 else "")


def _reason(results: list[Result], config_id: str) -> str:
    bad = [r for r in results if r.config_id == config_id and not r.ok]
    return f"{bad[0].status}: {bad[0].reason}" if bad else "no value of the metric"


def judge(s: Shift, metric: Metric, threshold: float, noise_floor: float, flag: str | None = None) -> str:
    """The verdict of one config. ``flag`` is None under Bonferroni (the interval decides a
    change), else what Benjamini-Hochberg flagged: "regressed", "improved" or "" (nothing)."""
    # "good" = the ratio in the direction where larger is better
    g = s.ratio if metric.higher_is_better else 1 / s.ratio
    if flag:  # BH flagged it, so its interval (at the FCR level) is beyond the noise floor
        if flag == "regressed" and g <= 1 - threshold:
            return "regressed"
        if flag == "improved" and g >= 1 + threshold:
            return "improved"
    if not s.has_ci:
        return "inconclusive"
    lo, hi = (s.ci_low, s.ci_high) if metric.higher_is_better else (1 / s.ci_high, 1 / s.ci_low)
    if flag is None and hi < 1 - noise_floor and g <= 1 - threshold:
        return "regressed"
    if flag is None and lo > 1 + noise_floor and g >= 1 + threshold:
        return "improved"
    if lo < 1 - threshold or hi > 1 + threshold:
        return "inconclusive"
    return "unchanged"


def _exact(metric: Metric, b: list[float], c: list[float]) -> bool:
    """An exact metric whose repeats agree on each side (``Metric.exact``)."""
    return metric.exact and bool(b) and bool(c) and len(set(b)) == 1 and len(set(c)) == 1


def judge_exact(ratio: float, metric: Metric, threshold: float) -> str:
    """The verdict of an exact count: its change against the threshold, no interval needed."""
    g = ratio if metric.higher_is_better else 1 / ratio
    return "regressed" if g <= 1 - threshold else "improved" if g >= 1 + threshold else "unchanged"


def bh_flags(pairs: dict[str, tuple[list[float], list[float]]], metric: Metric, noise_floor: float,
             alpha: float, paired: bool = False) -> dict[str, str]:
    """config_id -> "regressed" / "improved" / "": Benjamini-Hochberg at ``alpha`` over the
    configs' one-sided p-values, in each direction separately. ``pairs`` maps a config to its
    (baseline, current) values; a regression is a good-direction ratio below 1 - F."""
    ids = list(pairs)

    def good(b: list[float], c: list[float]) -> tuple[list[float], list[float]]:
        # (x, y) with y / x the good-direction ratio; p_below(x, y, r): is y / x below r?
        return (b, c) if metric.higher_is_better else (c, b)

    sides = [good(*pairs[i]) for i in ids]
    below = paired_p_below if paired else p_below
    p_reg = [below(x, y, 1 - noise_floor) for x, y in sides]
    p_imp = [below(y, x, 1 / (1 + noise_floor)) for x, y in sides]  # x / y below 1 / (1 + F)
    reg, imp = benjamini_hochberg(p_reg, alpha), benjamini_hochberg(p_imp, alpha)
    return {i: "regressed" if r else "improved" if m else "" for i, r, m in zip(ids, reg, imp)}


def compare(baseline: list[Result], current: list[Result], metric_name: str = "throughput",
            threshold: float = 0.03, noise_floor: float = 0.01, alpha: float = 0.01,
            labels: tuple[str, str] = ("baseline", "current"), correction: str = "bonferroni",
            paired: bool = False, best_of: int = 1) -> Comparison:
    """Every config's verdict. ``paired``: repeat i of the baseline ran beside repeat i of the
    current (lockstep rounds), so each config is judged on the per-round ratios (Wilcoxon
    signed-rank, ``paired_shift``) of the repeats ok on both sides. ``best_of`` k (paired
    only): each side's best of k consecutive rounds makes one pair, so that a process that was
    slow for its whole life (a few in ten on a small VM) no longer decides a pair; under no
    change the two sides' bests are as exchangeable as single rounds, so the test holds."""
    metric = GATE_METRICS[metric_name]
    censored = _censored([*baseline, *current], metric)
    base, cur = _values(baseline, metric, censored), _values(current, metric, censored)
    if best_of < 1 or (best_of > 1 and not paired):
        raise InputError(f"--best-of {best_of}: " + ("must be at least 1" if best_of < 1 else
                                                      "needs paired rounds (the two sides of one gpubench ab "
                                                      "--lockstep)"))
    pairs = _pairs(baseline, current, metric, censored, best_of) if paired else {}
    for k in base.keys() & cur.keys() if paired else ():  # a config's values: those of its complete rounds
        base[k], cur[k] = pairs.get(k, ([], []))
    if base and cur and not base.keys() & cur.keys():  # a gate that compared nothing must not pass
        raise InputError(f"{labels[0]} vs {labels[1]}: no config is in both ({_some(base)} in {labels[0]}, "
                         f"{_some(cur)} in {labels[1]}); configs are matched by config_id")
    both = [c for c in base if c in cur and base[c] and cur[c]]
    for side, values, label in ((baseline, base, labels[0]), (current, cur, labels[1])):
        if side and not any(values.values()):
            raise InputError(f"{label}: no ok result has the metric {metric_name!r}"
                             + (" (energy needs GPU telemetry)" if metric.name == "energy_per_sample_j" else ""))
    if base.keys() & cur.keys() and not both:  # shared configs, but none measured on both sides
        raise InputError(f"{labels[0]} vs {labels[1]}: no config has an ok result with {metric_name!r} on both "
                         "sides; nothing to compare (see each run's errors)")
    flags: dict[str, str] | None = None
    if correction == "bh":
        flags = bh_flags({c: (base[c], cur[c]) for c in both}, metric, noise_floor, alpha, paired)
        flagged = sum(bool(f) for f in flags.values())
        alpha_config = alpha * max(1, flagged) / max(1, len(both))  # the FCR-adjusted level
    else:
        alpha_config = alpha / max(1, len(both))  # one-sided, per config
    needed = repeats_for(alpha, len(both), correction, paired, best_of)  # repeats (rounds) a side
    if both and all(min(len(base[c]), len(cur[c])) * best_of < needed and not _exact(metric, base[c], cur[c])
                    for c in both):
        fewest = min(min(len(base[c]), len(cur[c])) for c in both) * best_of
        raise InputError(f"{labels[0]} vs {labels[1]}: configs have {fewest} repeat(s) on a side; comparing "
                         f"{len(both)} config(s) at alpha {alpha:g}{f' best of {best_of}' if best_of > 1 else ''} "
                         f"needs at least {needed} repeats per side (gpubench run --repeats {needed})")
    verdicts = []
    for config_id in list(dict.fromkeys([*base, *cur])):
        b, c = base.get(config_id, []), cur.get(config_id, [])
        missed = censored.get(config_id)
        b_med, c_med = _median(b, missed), _median(c, missed)
        if not c:
            note = "not in current" if config_id not in cur else _reason(current, config_id)
            verdicts.append(ConfigVerdict(config_id, "missing", None, None, None, b_med, None, len(b), 0, note))
            continue
        if not b:
            note = "not in baseline" if config_id not in base else _reason(baseline, config_id)
            verdicts.append(ConfigVerdict(config_id, "new", None, None, None, None, c_med, 0, len(c), note))
            continue
        if missed is not None and b_med is None and c_med is None and not any(v != missed for v in b + c):
            verdicts.append(ConfigVerdict(config_id, "inconclusive", None, None, None, None, None, len(b), len(c),
                                          f"neither side reached the target ({_reach_note(b, c, missed)}): "
                                          "no time to compare"))
            continue
        if _exact(metric, b, c):
            verdicts.append(ConfigVerdict(config_id, judge_exact(c[0] / b[0], metric, threshold), c[0] / b[0],
                                          c[0] / b[0], c[0] / b[0], b_med, c_med, len(b), len(c),
                                          "exact: each side's repeats give the same count"))
            continue
        noise = round_spread(b, c) if paired else pooled_log_sd([b, c])
        s = paired_shift(b, c, 2 * alpha_config) if paired else shift(b, c, 2 * alpha_config)
        note = "" if s.has_ci else (f"too few rounds for a CI (needs {best_of * min_pairs(2 * alpha_config)})"
                                    if paired else
                                    f"too few repeats for a CI (needs {min_repeats(2 * alpha_config)} per side)")
        flag = None if flags is None else flags.get(config_id, "")
        reach = "" if missed is None else _reach_note(b, c, missed) + (
            "; a repeat that missed counts as slower than every one that reached (MLPerf's rule): the change is "
            "a bound" if missed in b + c else "")
        note = "; ".join(filter(None, [reach, note, setting_differences(baseline, current, config_id),
                                       unequal_steps(baseline, current, config_id, metric)]))
        verdicts.append(ConfigVerdict(config_id, judge(s, metric, threshold, noise_floor, flag), s.ratio,
                                      None if math.isnan(s.ci_low) else s.ci_low,
                                      None if math.isnan(s.ci_high) else s.ci_high, b_med, c_med, len(b), len(c), note,
                                      noise))
    return Comparison(metric, threshold, noise_floor, alpha, alpha_config, verdicts, correction, paired, best_of)


def _reach_note(b: list[float], c: list[float], censored: float) -> str:
    """``reached 3/6 vs 6/6``: the repeats of each side that reached the target, in the order of
    the change (current, or candidate, over baseline)."""
    def reached(values: list[float]) -> str:
        return f"{sum(v != censored for v in values)}/{len(values)}"

    return f"reached {reached(c)} vs {reached(b)}"


def unequal_steps(baseline: list[Result], current: list[Result], config_id: str, metric: Metric) -> str:
    """Where the two sides ran to a target (a run stops when it reaches it) and the metric is
    not the target's own: the medians of the steps their figures come from, when they differ by
    more than a quarter ("" otherwise). A rate over 100 steps and one over 500 are not on equal
    terms: the first carries more of the first steps and of the machine's noise."""
    if metric.path[:2] == ("metrics", "target"):
        return ""

    def steps(results: list[Result]) -> float | None:
        n = [sum(r.get("metrics", "window_steps") or []) for r in results
             if r.config_id == config_id and r.ok and r.get("metrics", "target")]
        return float(statistics.median(n)) if n else None

    a, b = steps(baseline), steps(current)
    if a is None or b is None or max(a, b) <= 1.25 * min(a, b):
        return ""
    return (f"runs to a target: these figures come from {a:g} and {b:g} steps (medians), not equal terms; "
            "measure the rate with timed windows (no target)")


def setting_differences(baseline: list[Result], current: list[Result], config_id: str) -> str:
    """The settings in which the two sides' configs of one id differ ("" when none do): an id
    names what tells the points of one sweep apart, so two runs of different suites or
    ``--set`` values can give one id to configs that measure differently (20 steps a window
    against 50); the verdict then says so beside it."""
    def settings(results: list[Result]) -> dict[str, Any]:
        found = next((r.config for r in results if r.config_id == config_id), {})
        return {k: v for k, v in found.items() if k != "id_keys"}

    a, b = settings(baseline), settings(current)
    diffs = [f"{k} {a[k]!r} vs {b[k]!r}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]
    return f"settings differ: {', '.join(diffs)}" if diffs else ""


def fingerprint_differences(a: dict[str, Any], b: dict[str, Any], frameworks: set[str]) -> list[str]:
    """What differs between two environments in ways that change performance: the CPU model,
    the GPUs and their driver, and the versions (and CUDA builds) of the frameworks compared."""
    diffs = []
    if a.get("cpu_model") != b.get("cpu_model"):
        diffs.append(f"cpu_model: {a.get('cpu_model')!r} vs {b.get('cpu_model')!r}")
    def gpus(env: dict[str, Any]) -> list[tuple[Any, Any]]:
        return [(g.get("name"), g.get("driver")) for g in env.get("gpus") or []]
    if gpus(a) != gpus(b):
        diffs.append(f"GPUs/driver: {gpus(a) or 'none'} vs {gpus(b) or 'none'}")
    for fw in sorted(frameworks):
        pa, pb = dig(a, "frameworks", fw), dig(b, "frameworks", fw)
        for key, path in (("version", ("version",)), ("cuda", ("build", "cuda")), ("cudnn", ("build", "cudnn"))):
            if dig(pa, *path) != dig(pb, *path):
                diffs.append(f"{fw} {key}: {dig(pa, *path)} vs {dig(pb, *path)}")
    return diffs
