"""Change points on a metric's series (gate.changepoints): the energy statistic, the steps it
finds and misses, and the permutation test's false alarms on series without a step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpubench.gate.changepoints import best_split, change_points, split_statistics
from gpubench.gate.power import caught_share, minimal_detectable, repeats_needed


def series(rng, n: int, noise: float, steps: dict[int, float] | None = None) -> np.ndarray:
    """n points of lognormal noise around 1000; from each index in ``steps`` on, times its factor."""
    v = 1000.0 * np.exp(rng.normal(0.0, noise, n))
    for at, factor in (steps or {}).items():
        v[at:] *= factor
    return v


def test_the_split_statistic_is_the_energy_distance_of_the_two_sides():
    rng = np.random.default_rng(1)
    x = rng.normal(size=13)

    def energy(t: int) -> float:
        left, right = x[:t], x[t:]
        m = len(right)
        between = np.abs(left[:, None] - right[None, :]).mean()
        within_l = np.abs(left[:, None] - left[None, :]).sum() / (t * (t - 1))
        within_r = np.abs(right[:, None] - right[None, :]).sum() / (m * (m - 1))
        return t * m / len(x) * (2 * between - within_l - within_r)

    q = split_statistics(np.abs(x[:, None] - x[None, :]), 3)
    assert q == pytest.approx([energy(t) for t in range(3, 11)])
    assert best_split(x[:5], 3) == (0, -math.inf)  # too short for two sides of 3


def test_a_step_is_found_at_its_commit_with_its_size_and_interval():
    rng = np.random.default_rng(7)
    (cp,) = change_points(series(rng, 40, 0.02, {25: 0.90}))
    assert cp.index == 25 and cp.p_value <= 0.01 and (cp.n_before, cp.n_after) == (25, 15)
    assert cp.ci_low < 0.90 < cp.ci_high and cp.ratio == pytest.approx(0.90, abs=0.01)
    assert cp.ci_high < 0.95  # the interval is the gate's: it excludes no change


def test_two_steps_each_sized_against_its_neighbours():
    rng = np.random.default_rng(3)
    first, second = change_points(series(rng, 60, 0.02, {20: 0.85, 40: 1.25}))
    assert (first.index, second.index) == (20, 40)
    assert first.ratio == pytest.approx(0.85, abs=0.015) and (first.n_before, first.n_after) == (20, 20)
    assert second.ratio == pytest.approx(1.25, abs=0.02) and second.n_after == 20


def test_series_without_a_step_give_few_false_change_points():
    """50 series of 100 points, no step, p <= 0.01: the first test of each is a false alarm
    with probability at most 0.01, so more than 3 false change points would be a broken test."""
    rng = np.random.default_rng(11)
    false = sum(len(change_points(series(rng, 100, 0.05), seed=i)) for i in range(50))
    assert false <= 3, false


def test_a_small_step_in_heavy_noise_is_not_claimed():
    rng = np.random.default_rng(5)
    assert change_points(series(rng, 12, 0.10, {6: 0.97})) == []


def test_bad_series_and_settings_are_refused():
    with pytest.raises(ValueError, match="positive"):
        change_points([1.0, 2.0, 0.0, 3.0])
    with pytest.raises(ValueError, match="min_size"):
        change_points([1.0] * 10, min_size=1)


def test_the_minimal_detectable_slowdown_is_where_the_gate_starts_catching_95_percent():
    """At 2% noise, 10 repeats a side, the default gate: the bisection's answer is caught at
    least 95% of the time and a slowdown half a point smaller is not."""
    mde = minimal_detectable(0.02, 10, 0.01, 0.03, 0.01)
    assert mde is not None and 0.03 < mde < 0.06
    assert caught_share(0.02, 10, mde, 0.01, 0.03, 0.01) >= 0.95 > caught_share(0.02, 10, mde - 0.005, 0.01, 0.03, 0.01)
    assert minimal_detectable(0.02, 3, 0.01, 0.03, 0.01) is None  # 3 repeats give no 98% interval
    # more noise needs more repeats; a slowdown at the threshold is never caught 95% of the time
    assert repeats_needed(0.02, 0.05, 0.01, 0.03, 0.01) < repeats_needed(0.04, 0.05, 0.01, 0.03, 0.01)
    assert repeats_needed(0.02, 0.03, 0.01, 0.03, 0.01) is None


def test_a_stalled_run_no_longer_hides_a_step():
    """One run that stalled (3% of its level) among 14 commits with a 40% step at commit 8: kept,
    it dominates every distance and the step goes unfound; left out as an isolated outlier, the
    step is found where it is (indices of the whole series)."""
    import numpy as np

    from gpubench.gate.changepoints import change_points, isolated_outliers

    rng = np.random.default_rng(0)
    values = 45000 * np.exp(rng.normal(0, 0.02, 14))
    values[8:] *= 0.6
    values[3] *= 0.03
    assert list(np.flatnonzero(isolated_outliers(np.log(values)))) == [3]
    assert change_points(values, drop_outliers=False) == []
    (cp,) = change_points(values)
    assert cp.index == 8 and 0.55 < cp.ratio < 0.65
    # a step's own points are never outliers, nor are two wild points close together
    step = np.log(np.r_[np.full(6, 45000.0), np.full(6, 27000.0)])
    assert not isolated_outliers(step).any()
    pair = np.log(np.r_[np.full(5, 45000.0), [1300.0, 1200.0], np.full(5, 45000.0)])
    assert not isolated_outliers(pair).any()


def test_a_large_step_in_ten_commits_with_a_stalled_run_is_found_by_the_t_test_of_short_splits():
    """Ten commits, a run that stalled at commit 2 (3% of its level), a 40% step at commit 7:
    left out, the stall leaves 6 | 3 points, whose permutation test cannot go below 2 / 84. The
    two sides do not overlap, so the split is tested by Student's t (times the 4 open splits)
    and counts; without that test nothing is found."""
    from gpubench.gate.changepoints import permutation_floor, short_split_p

    rng = np.random.default_rng(0)
    values = 45000 * np.exp(rng.normal(0, 0.02, 10))
    values[7:] *= 0.6
    values[2] *= 0.03
    assert permutation_floor(9, 6) == pytest.approx(2 / 84) and permutation_floor(9, 6) > 0.01
    (cp,) = change_points(values)
    assert (cp.index, cp.previous_index, cp.test) == (7, 6, "t") and cp.p_value <= 0.01
    assert 0.55 < cp.ratio < 0.65 and (cp.n_before, cp.n_after) == (6, 3)
    assert change_points(values, short_splits=False) == []
    # a stall at the very first commit is left out too (it is far from each of its neighbours)
    first = values.copy()
    first[2] /= 0.03
    first[0] *= 0.03
    (cp,) = change_points(first)
    assert cp.index == 7 and cp.test == "t"
    # where one point of the slow side overlaps the fast side, the t-test is not used: a 7 | 3
    # split (floor 2 / 120) with its middle slow point as fast as the fast side's fastest
    overlap = 45000 * np.exp(rng.normal(0, 0.02, 10))
    overlap[7:] *= 0.6
    overlap[8] = overlap[:7].max() * 1.01
    logs = np.log(overlap)
    assert short_split_p(logs, 7, 3) is None and permutation_floor(10, 7) > 0.01
    assert change_points(overlap) == []
    clean = logs.copy()
    clean[8] = clean[9]
    assert short_split_p(clean, 7, 3) < 1e-4  # the same split without the overlap: tested, significant


def test_short_series_without_a_step_keep_the_false_alarm_rate_of_the_p_value():
    """400 series of 10 points without a step, heavy-tailed noise (Student's t, 3 degrees of
    freedom): at p <= 0.01 about 4 false change points are expected; more than 12 would mean
    the t-test of short splits adds false alarms (binomial tail below 1e-4)."""
    rng = np.random.default_rng(3)
    false = sum(len(change_points(45000 * np.exp(0.03 * rng.standard_t(3, 10)), seed=i)) for i in range(400))
    assert false <= 12, false


def test_near_the_permutation_floor_the_t_test_decides_not_chance():
    """12 to 15 commits, a 40% step with 3 commits after it: the permutation floor (2 / 220 at
    12) is below 0.01, but 199 random orderings would count such a split only about half the
    time; the t-test of the first split finds it for every seed."""
    for n in (12, 13, 15):
        rng = np.random.default_rng(n)
        for seed in range(10):
            values = 45000 * np.exp(rng.normal(0, 0.02, n))
            values[n - 3:] *= 0.6
            cps = change_points(values, seed=seed)
            assert [c.index for c in cps] == [n - 3], (n, seed, cps)


def test_series_side_by_side_add_up_a_step_they_share():
    """12 series of 40 points, 3% noise each, all 3% lower from point 25: alone, a series
    rarely shows the step; together (rows the points) it is found at 25, its size that of the
    rows' geometric means. One column is the series itself; a stalled run in one series drops
    its row; a 3-D array is refused."""
    rng = np.random.default_rng(2)
    values = 1000 * np.exp(rng.normal(0, 0.03, (40, 12)))
    values[25:] *= 0.97
    alone = sum(any(c.index == 25 for c in change_points(values[:, j])) for j in range(12))
    (cp,) = change_points(values)
    assert cp.index == 25 and cp.p_value <= 0.01 and 0.96 < cp.ratio < 0.98 and alone <= 3
    assert change_points(values[:, :1]) == change_points(values[:, 0])
    stalled = values.copy()
    stalled[10, 3] *= 0.03
    (cp,) = change_points(stalled)
    assert cp.index == 25 and cp.n_before == 24  # row 10 left out
    # a much noisier series (30%) among them does not drown the shared step: each series
    # counts in units of its own spread
    noisy = values.copy()
    noisy[:, 0] = 1000 * np.exp(rng.normal(0, 0.3, 40)) * np.r_[np.ones(25), np.full(15, 0.97)]
    assert [c.index for c in change_points(noisy)] == [25]
    with pytest.raises(ValueError, match="side by side"):
        change_points(np.ones((4, 4, 4)))


def test_the_p_value_of_two_noiseless_levels_reads_as_a_bound_not_zero():
    from gpubench.gate.changepoints import ChangePoint
    from gpubench.history.changes import Step, p_text

    def step(p: float, test: str) -> Step:
        change = ChangePoint(5, 4, p, 0.6, 0.55, 0.65, 5, 5, test)
        return Step("s", "c", "m", "throughput", "b", "a", 5, 10, 5, "regression", change)

    assert p_text(step(0.0, "t")) == "< 1e-300 t"
    assert p_text(step(0.0123, "permutation")) == "0.0123" and p_text(step(0.004, "together")) == "0.004 together"
