"""Statistics on fixed inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpubench.measure.stats import is_noisy, median_ci, step_stats, throughput


def test_step_stats_on_fixed_values():
    st = step_stats([10.0, 11.0, 9.0, 10.0, 12.0, 8.0, 10.0, 10.0, 11.0, 9.0])
    assert st.n == 10
    assert st.median == 10.0
    assert st.mean == pytest.approx(10.0)
    # numpy linear percentiles of the sorted values 8 9 9 10 10 10 10 11 11 12
    assert st.p5 == pytest.approx(8.45)
    assert st.p95 == pytest.approx(11.55)
    assert st.iqr == pytest.approx(10.75 - 9.25)
    assert st.cv == pytest.approx(np.std([10, 11, 9, 10, 12, 8, 10, 10, 11, 9], ddof=1) / 10.0)
    # n = 10: the 95% order-statistic interval is (x_(2), x_(9)) in 1-based ranks: 9 and 11
    assert (st.ci_low, st.ci_high) == (9.0, 11.0)


@pytest.mark.parametrize("n, rank", [(6, 0), (10, 1), (20, 5), (50, 17), (100, 39), (1000, 468)])
def test_median_ci_ranks_match_the_binomial_table(n, rank):
    # ranks checked against scipy.stats.binom; values 0..n-1 so the CI bounds are the ranks
    lo, hi = median_ci(np.arange(n, dtype=float))
    assert (lo, hi) == (rank, n - 1 - rank)


def test_median_ci_covers_the_true_median_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    hits = sum(lo <= 0.0 <= hi for lo, hi in (median_ci(rng.standard_normal(30)) for _ in range(2000)))
    assert 0.94 <= hits / 2000 <= 0.99  # exact coverage for n=30 is 0.957


def test_median_ci_small_and_large_samples():
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)  # below 6 samples: min and max
    assert all(math.isnan(v) for v in median_ci([]))
    x = np.arange(10001, dtype=float)
    lo, hi = median_ci(x)  # normal approximation branch
    assert 4890 <= lo < 5000 < hi <= 5110


def test_throughput_inverts_step_times():
    st = step_stats([10.0] * 5 + [20.0] * 5)
    tp = throughput(st, samples_per_step=64)
    assert tp.median == pytest.approx(64 * 1000 / 15.0)
    assert tp.mean == pytest.approx(64 * 1000 / 15.0)
    assert tp.ci_low == pytest.approx(64 * 1000 / 20.0)
    assert tp.ci_high == pytest.approx(64 * 1000 / 10.0)


def test_noisy_flag():
    assert not is_noisy(step_stats([10.0, 10.1, 9.9, 10.0]))
    assert is_noisy(step_stats([10.0, 15.0, 5.0, 10.0]))
    with pytest.raises(ValueError):
        step_stats([])
