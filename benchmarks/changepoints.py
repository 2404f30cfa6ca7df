"""Validation of ``gpubench history check``'s change-point detection on synthetic series.

    PYTHONPATH=. python benchmarks/changepoints.py [--series 200] [--length 60] [--seed 0]

Each series is ``--length`` points of lognormal noise (the between-run variation of a metric:
2% or 5%), with one step down of 3%, 5% or 10% at a random point between the first and last
quarter (a slowdown landing at one commit). The detector (``gate.changepoints.change_points``,
the defaults of ``history check``) runs on each; a change point within ``--tolerance`` points
of the true step is a true positive, every other one a false positive. Printed per cell:
precision (true positives over change points found), recall (steps found over steps),
the median distance from the true step, and a bound: the share of the series in which
Student's t, told where the step is, reaches the same p-value (no detector that has to find
the step can do much better at that p-value). Then series with no step at all: false change
points per 1,000 points, from ``--null-series`` series of 1,000 points at each noise level.
Then series of 10, 20 and 40 points with one stalled run (a point at 3% of its level, a run
that stalled: 1.3k samples/s among 45k) away from a step of 10% or 40%, or with no step: the
recall and the false change points of the detector as it is, with isolated outliers kept, and
without Student's t for the splits too short for a permutation test. Last, short series with no
step and heavy-tailed noise (Student's t, 3 degrees of freedom): the false change points that
the t-test of short splits adds. Last, suites of 1, 4 and 12 configs on the same commits, each
config with its own noise, all 3% slower from one commit (or none): recall and false change
points searching the configs together (``history check --together``) and each alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpubench.gate.changepoints import DEFAULT_MIN_SIZE, DEFAULT_P_VALUE, change_points  # noqa: E402

NOISES = (0.02, 0.05)
STEPS = (0.03, 0.05, 0.10)


def cell(rng: np.random.Generator, noise: float, step: float, series: int, length: int,
         tolerance: int) -> tuple[float, float, float, float]:
    """(precision, recall, median distance of the found steps, the recall of Student's t told
    where the step is) over ``series`` series."""
    found = true = told = 0
    distances = []
    for i in range(series):
        at = int(rng.integers(length // 4, length - length // 4 + 1))
        values = 1000.0 * np.exp(rng.normal(0.0, noise, length))
        values[at:] *= 1 - step
        cps = change_points(values, seed=i)
        logs = np.log(values)
        told += float(scipy_stats.ttest_ind(logs[:at], logs[at:]).pvalue) <= DEFAULT_P_VALUE
        found += len(cps)
        near = [abs(c.index - at) for c in cps if abs(c.index - at) <= tolerance]
        if near:
            true += 1
            distances.append(min(near))
    precision = true / found if found else float("nan")
    return precision, true / series, statistics.median(distances) if distances else float("nan"), told / series


def null_rate(rng: np.random.Generator, noise: float, series: int) -> float:
    """False change points per 1,000 points of series with no step."""
    false = sum(len(change_points(1000.0 * np.exp(rng.normal(0.0, noise, 1000)), seed=i)) for i in range(series))
    return false / series


VARIANTS = {"default": {}, "outlier kept": {"drop_outliers": False}, "permutations only": {"short_splits": False}}


def stalled_cell(rng: np.random.Generator, length: int, noise: float, step: float | None, series: int,
                 tolerance: int) -> dict[str, tuple[float, float]]:
    """Series with one stalled run (a point at 3% of its level, as 1.3k samples/s among 45k) at a
    random place away from the step: per variant of the detector (VARIANTS), (recall, false change
    points per series). ``step`` None: no step (false alarms only)."""
    hits = dict.fromkeys(VARIANTS, 0)
    false = dict.fromkeys(VARIANTS, 0)
    for i in range(series):
        at = int(rng.integers(length // 4, length - length // 4 + 1))
        values = 45000.0 * np.exp(rng.normal(0.0, noise, length))
        if step is not None:
            values[at:] *= 1 - step
        stall = int(rng.choice([k for k in range(length) if step is None or abs(k - at) > 1]))
        values[stall] *= 0.03
        for name, options in VARIANTS.items():
            cps = change_points(values, seed=i, **options)
            near = [c for c in cps if step is not None and abs(c.index - at) <= tolerance]
            hits[name] += bool(near)
            false[name] += len(cps) - (1 if near else 0)
    return {name: (hits[name] / series, false[name] / series) for name in VARIANTS}


def heavy_null(rng: np.random.Generator, length: int, series: int) -> tuple[float, float]:
    """Short series without a step, of heavy-tailed noise (Student's t with 3 degrees of freedom,
    scale 3%): false change points per series with the t-test of short splits, and without."""
    false = [0, 0]
    for i in range(series):
        values = 45000.0 * np.exp(0.03 * rng.standard_t(3, length))
        false[0] += len(change_points(values, seed=i))
        false[1] += len(change_points(values, seed=i, short_splits=False))
    return false[0] / series, false[1] / series


def together_cell(rng: np.random.Generator, k: int, noise: float, step: float | None, series: int, length: int,
                  tolerance: int) -> tuple[float, float, float, float]:
    """``k`` series side by side (one suite's configs on the same commits), each with its own
    lognormal noise, all stepping down by ``step`` at the same random commit of the middle half
    (None: no step): (recall searched together, the share of the k series in which the step is
    found searching each alone, false change points per suite together, per series alone)."""
    together = alone = false_together = false_alone = 0.0
    for i in range(series):
        at = int(rng.integers(length // 4, length - length // 4 + 1))
        values = 1000.0 * np.exp(rng.normal(0.0, noise, (length, k)))
        if step is not None:
            values[at:] *= 1 - step
        cps = change_points(values, seed=i)
        near = [c for c in cps if step is not None and abs(c.index - at) <= tolerance]
        together += bool(near)
        false_together += len(cps) - (1 if near else 0)
        for j in range(k):
            own = change_points(values[:, j], seed=i)
            hit = [c for c in own if step is not None and abs(c.index - at) <= tolerance]
            alone += bool(hit) / k
            false_alone += (len(own) - (1 if hit else 0)) / k
    return together / series, alone / series, false_together / series, false_alone / series


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=200, help="series per cell (default 200)")
    ap.add_argument("--length", type=int, default=60, help="points per series (default 60)")
    ap.add_argument("--tolerance", type=int, default=3, help="how far from the true step a find counts (default 3)")
    ap.add_argument("--null-series", type=int, default=20, help="series of 1,000 points with no step (default 20)")
    ap.add_argument("--null-short", type=int, default=2000,
                    help="heavy-tailed short series without a step, per length (default 2000)")
    ap.add_argument("--together-series", type=int, default=100, help="suites per cell of the last table (default 100)")
    ap.add_argument("--together-length", type=int, default=30, help="commits of the last table's suites (default 30)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    t0 = time.perf_counter()
    print(f"E-Divisive means, p <= {DEFAULT_P_VALUE}, min segment {DEFAULT_MIN_SIZE}; {a.series} series of "
          f"{a.length} points per cell, one step down at a random point in the middle half; a find within "
          f"{a.tolerance} points of it is a true positive")
    print()
    print("| noise | step | precision | recall | median distance (points) | recall of t told where the step is |")
    print("| --- | --- | --- | --- | --- | --- |")
    for noise in NOISES:
        for step in STEPS:
            precision, recall, distance, told = cell(rng, noise, step, a.series, a.length, a.tolerance)
            print(f"| {noise:.0%} | {step:.0%} | {precision:.3f} | {recall:.3f} | {distance:g} | {told:.3f} |")
    print()
    print("| noise | false change points per 1,000 points (no step) |")
    print("| --- | --- |")
    for noise in NOISES:
        print(f"| {noise:.0%} | {null_rate(rng, noise, a.null_series):.2f} (over {a.null_series} series) |")
    print()
    print(f"One stalled run (a point at 3% of its level) in each series, away from the step; {a.series} series "
          "per cell. Recall and false change points per series of the detector as it is (default), with the "
          "outlier kept, and without Student's t for splits too short for their permutation test:")
    print()
    print("| length | noise | step | " + " | ".join(f"recall, {v}" for v in VARIANTS) + " | "
          + " | ".join(f"false, {v}" for v in VARIANTS) + " |")
    print("| --- | --- | --- |" + " --- |" * (2 * len(VARIANTS)))
    for length in (10, 20, 40):
        for noise in NOISES:
            for step in (None, 0.10, 0.40):
                got = stalled_cell(rng, length, noise, step, a.series, a.tolerance)
                shown = f"{step:.0%}" if step is not None else "none"
                print(f"| {length} | {noise:.0%} | {shown} | " + " | ".join(f"{got[v][0]:.3f}" for v in VARIANTS)
                      + " | " + " | ".join(f"{got[v][1]:.3f}" for v in VARIANTS) + " |")
    print()
    print(f"Short series without a step, heavy-tailed noise (Student's t, 3 degrees of freedom, scale 3%), "
          f"{a.null_short} series a length: false change points per series")
    print()
    print("| length | with t for short splits | permutations only |")
    print("| --- | --- | --- |")
    for length in (8, 10, 12, 16):
        with_t, without = heavy_null(rng, length, a.null_short)
        print(f"| {length} | {with_t:.4f} | {without:.4f} |")
    print()
    print(f"Configs that step together: k series of {a.together_length} points side by side (one suite's configs on "
          f"the same commits), each with its own noise, all 3% slower from the same commit of the middle half, or "
          f"with no step; {a.together_series} suites a cell; searched together (`history check --together`) "
          "against each series alone:")
    print()
    print("| configs | noise | step | recall, together | recall, each alone | false per suite, together | "
          "false per series, alone |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k in (1, 4, 12):
        for noise in (0.03, 0.05):
            for step in (None, 0.03):
                got = together_cell(rng, k, noise, step, a.together_series, a.together_length, a.tolerance)
                shown = f"{step:.0%}" if step is not None else "none"
                print(f"| {k} | {noise:.0%} | {shown} | " + " | ".join(f"{v:.3f}" for v in got) + " |")
    print(f"\n{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
