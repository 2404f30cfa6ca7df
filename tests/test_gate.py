"""The regression gate: statistics, verdicts, validation on simulated data, and the CLI."""

from __future__ import annotations

import json
import re
from xml.etree import ElementTree

import numpy as np
import pytest

from gpubench.errors import InputError
from gpubench.gate.compare import GATE_METRICS as METRICS
from gpubench.gate.compare import bh_flags, compare, fingerprint_differences, judge, parse_fraction
from gpubench.results.result import Result
from gpubench.gate.stats import Shift, _rank_k, _u_cdf, benjamini_hochberg, min_repeats, p_below, shift
from tests.conftest import run_cli

ENV = {"cpu_model": "Fixture CPU", "gpus": [], "frameworks": {"torch": {"version": "2.13.0", "build": {}}}}


def results(values: dict[str, list[float]], run_id: str = "r", status: str = "ok", memory: float | None = None,
            telemetry: dict | None = None, env: dict = ENV):
    out = []
    for config_id, vs in values.items():
        for i, v in enumerate(vs):
            out.append(Result.from_json({"schema_version": 1, "run_id": run_id, "config_id": config_id, "repeat": i,
                        "config": {"framework": "torch"}, "status": status, "reason": "",
                        **({"telemetry": telemetry} if telemetry else {}),
                        "metrics": {"throughput": {"median": v, "ci_low": 0.9 * v, "ci_high": 1.1 * v},
                                    "step_time_ms": {"median": 1000.0 / v, "cv": 0.01}, "cold_start_ms": 3000.0 / v,
                                    "samples_per_step": 64,
                                    "step_times_ms": [1000.0 / v] * 2,
                                    "memory": {"peak_rss_bytes": memory or 1e9}}, "env": env}))
    return out


def test_u_distribution_matches_scipy_exact():
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(0)
    for n, m in ((4, 6), (7, 5), (10, 10)):
        cdf = _u_cdf(n, m)
        assert cdf[-1] == pytest.approx(1.0) and np.all(np.diff(cdf) >= 0)
        for _ in range(20):
            x, y = rng.normal(size=n), rng.normal(0.5, size=m)
            res = mannwhitneyu(x, y, alternative="less", method="exact")  # P(U <= u) for U of x
            assert cdf[int(res.statistic)] == pytest.approx(res.pvalue)
    assert _rank_k(10, 10, 0.05) == 24  # tables: two-sided 5% critical U for n = m = 10 is 23
    assert min_repeats(0.01) == 5 and min_repeats(0.05) == 4


def test_hodges_lehmann_shift_on_fixed_values():
    s = shift([100, 101, 99, 100.5, 99.5, 100], [95, 96, 94, 95.5, 94.5, 95], alpha=0.05)
    assert s.ratio == pytest.approx(0.95, abs=1e-3)
    assert s.ci_low < 0.95 < s.ci_high < 0.97
    tiny = shift([1.0, 2.0], [1.5], alpha=0.05)
    assert not tiny.has_ci


@pytest.mark.parametrize("ratio, lo, hi, verdict", [
    (0.94, 0.92, 0.96, "regressed"),
    (0.96, 0.94, 0.98, "inconclusive"),  # real but under the threshold, CI crosses it
    (0.98, 0.975, 0.985, "unchanged"),  # real, small, CI inside the threshold band
    (1.00, 0.98, 1.02, "unchanged"),
    (0.94, 0.88, 1.00, "inconclusive"),  # point beyond the threshold but CI reaches the noise floor
    (1.06, 1.03, 1.09, "improved"),
])
def test_judge_rules(ratio, lo, hi, verdict):
    assert judge(Shift(ratio, lo, hi, 10, 10), METRICS["throughput"], 0.05, 0.01) == verdict


def test_lower_is_better_metrics_flip_the_direction():
    step = METRICS["step_time"]
    assert judge(Shift(1.06, 1.04, 1.08, 10, 10), step, 0.05, 0.01) == "regressed"
    assert judge(Shift(0.94, 0.92, 0.96, 10, 10), step, 0.05, 0.01) == "improved"


def lognormal(rng, n, cv, scale=1000.0):
    return list(scale * np.exp(rng.normal(0, cv, n)))


def test_a_a_false_positive_rate_is_at_most_1_percent():
    """1,000 A/A comparisons, between-process CV 2-5%, 10 repeats per side, default gate."""
    rng = np.random.default_rng(12345)
    flagged = 0
    for i in range(1000):
        cv = 0.02 + 0.03 * (i % 4) / 3  # 2%, 3%, 4%, 5%
        c = compare(results({"c": lognormal(rng, 10, cv)}), results({"c": lognormal(rng, 10, cv)}))
        flagged += bool(c.regressed)
    assert flagged / 1000 <= 0.01, flagged


def test_family_wise_false_positives_over_many_configs():
    """A/A on 20 configs at once: Bonferroni keeps the chance of any false alarm low."""
    rng = np.random.default_rng(7)
    alarms = 0
    for _ in range(100):
        base = {f"c{k}": lognormal(rng, 10, 0.04) for k in range(20)}
        cur = {f"c{k}": lognormal(rng, 10, 0.04) for k in range(20)}
        alarms += bool(compare(results(base), results(cur)).regressed)
    assert alarms <= 3


def test_a_5_percent_slowdown_is_caught_95_percent_of_the_time():
    """10 repeats per side at CV 2%, a true 5% slowdown, default gate."""
    rng = np.random.default_rng(99)
    caught = sum(bool(compare(results({"c": lognormal(rng, 10, 0.02)}),
                              results({"c": lognormal(rng, 10, 0.02, scale=950.0)})).regressed)
                 for _ in range(2000))
    assert caught / 2000 >= 0.95, caught


# --- false-discovery-rate control (Benjamini-Hochberg) beside Bonferroni -----------------------

def test_p_below_is_the_test_whose_inversion_is_the_interval():
    """The interval's upper end is below r exactly when the one-sided p-value of "ratio >= r" is
    at most alpha / 2 of the two-sided level: BH's flags and the reported intervals agree."""
    rng = np.random.default_rng(21)
    for _ in range(300):
        n, m = rng.integers(3, 14, size=2)
        b, c = lognormal(rng, n, 0.05), lognormal(rng, m, 0.05, scale=1000 * rng.uniform(0.9, 1.05))
        r0, alpha = float(rng.uniform(0.9, 1.05)), float(rng.choice([0.002, 0.01, 0.05]))
        s = shift(b, c, 2 * alpha)
        if s.has_ci:
            assert (s.ci_high < r0) == (p_below(b, c, r0) <= alpha), (n, m, r0, alpha)
    from scipy.stats import mannwhitneyu  # and it is the Mann-Whitney test of the shifted logs

    b, c = lognormal(rng, 8, 0.05), lognormal(rng, 9, 0.05, scale=960.0)
    ref = mannwhitneyu(np.log(c) - np.log(0.99), np.log(b), alternative="less", method="exact")
    assert p_below(b, c, 0.99) == pytest.approx(ref.pvalue)


def test_paired_shift_and_its_test_agree_and_match_scipy():
    """The paired interval's upper end is below r exactly when the one-sided signed-rank
    p-value of "ratio >= r" is at most alpha; the p-value is scipy's exact Wilcoxon test."""
    from scipy.stats import wilcoxon

    from gpubench.gate.stats import paired_p_below, paired_shift

    rng = np.random.default_rng(31)
    for _ in range(300):
        n = int(rng.integers(5, 25))
        b = lognormal(rng, n, 0.10)  # the machine's state, shared by the two sides of a round
        c = b * np.exp(rng.normal(np.log(rng.uniform(0.9, 1.05)), 0.03, n))
        r0, alpha = float(rng.uniform(0.9, 1.05)), float(rng.choice([0.002, 0.01, 0.05]))
        s = paired_shift(b, c, 2 * alpha)
        if s.has_ci:
            assert (s.ci_high < r0) == (paired_p_below(b, c, r0) <= alpha), (n, r0, alpha)
    b = lognormal(rng, 12, 0.1)
    c = b * np.exp(rng.normal(-0.02, 0.02, 12))
    ref = wilcoxon(np.log(c / b) - np.log(0.99), alternative="less", method="exact")
    assert paired_p_below(b, c, 0.99) == pytest.approx(ref.pvalue)


def test_pairing_cancels_what_the_two_sides_of_a_round_share():
    """Rounds whose machine speed wanders by 10% while the two sides differ by a 5% slowdown
    and 2% of their own noise: the paired comparison flags it in at least 90% of 200 simulated
    gates of 10 rounds (185 with this seed), the unpaired one in hardly any; A/A, the paired
    gate's false alarms stay within alpha."""
    rng = np.random.default_rng(5)
    caught = {True: 0, False: 0}
    alarms = 0
    for _ in range(200):
        machine = np.exp(rng.normal(0, 0.10, 10))
        base = 1000 * machine * np.exp(rng.normal(0, 0.02, 10))
        slower = 950 * machine * np.exp(rng.normal(0, 0.02, 10))
        same = 1000 * machine * np.exp(rng.normal(0, 0.02, 10))
        for paired in caught:
            caught[paired] += bool(compare(results({"c": base}), results({"c": slower}), paired=paired).regressed)
        alarms += bool(compare(results({"c": base}), results({"c": same}), paired=True).regressed)
    assert caught[True] >= 180 and caught[False] < 20, caught
    assert alarms <= 2, alarms


def test_best_of_pairs_each_sides_best_of_consecutive_rounds():
    base, cur = [100.0, 90.0, 80.0, 120.0, 110.0, 105.0, 95.0], [95.0, 99.0, 70.0, 60.0, 300.0, 100.0, 101.0]
    c = compare(results({"c": base}), results({"c": cur}), paired=True, best_of=2, alpha=0.2)
    (v,) = c.verdicts
    # pairs: (max(100, 90), max(95, 99)) = (100, 99), (120, 70), (110, 300); the seventh round is left out
    assert (v.n_baseline, v.baseline_median, v.current_median, c.best_of) == (3, 110.0, 99.0, 2)
    step = compare(results({"c": base}), results({"c": cur}), metric_name="step_ms", paired=True, best_of=2,
                   alpha=0.2)
    assert step.verdicts[0].baseline_median == pytest.approx(1000 / 110)  # lower is better: the smaller step time
    with pytest.raises(InputError, match="--best-of 2: needs paired rounds"):
        compare(results({"c": base}), results({"c": cur}), best_of=2)


def test_best_of_two_takes_the_slow_processes_out_of_the_pairs():
    """Workers slow for their whole life (each with a chance of 15%, 20% slower: about one round
    in three with a slow side, as measured on the 2-vCPU VM without huge pages) around a 5%
    slowdown and 2% noise: best of 2 rounds a pair flags it more often in 200 simulated gates
    of 24 rounds (149 against 128 with this seed), and in A/A its false alarms stay within
    alpha."""
    rng = np.random.default_rng(7)

    def side(scale):
        slow = rng.random(24) < 0.15
        return list(scale * np.exp(rng.normal(0, 0.02, 24)) * np.where(slow, 0.8, 1.0))

    caught = {1: 0, 2: 0}
    alarms = 0
    for _ in range(200):
        base, slower, same = side(1000.0), side(950.0), side(1000.0)
        for k in caught:
            caught[k] += bool(compare(results({"c": base}), results({"c": slower}), paired=True, best_of=k).regressed)
        alarms += bool(compare(results({"c": base}), results({"c": same}), paired=True, best_of=2).regressed)
    assert caught[2] >= 140 and caught[2] > caught[1] + 10, caught
    assert alarms <= 2, alarms


def test_benjamini_hochberg_is_the_step_up_rule():
    assert benjamini_hochberg([0.01, 0.04, 0.03, 0.005, 0.2], 0.05) == [True, True, True, True, False]
    assert benjamini_hochberg([0.001, 0.5, 0.026, 0.04], 0.05) == [True, False, False, False]
    # step-up: 0.02 misses its own bound (0.05 / 3) but is rejected with the larger 0.024 (<= 2 x 0.05 / 3)
    assert benjamini_hochberg([0.02, 0.024, 0.5], 0.05) == [True, True, False]
    assert benjamini_hochberg([], 0.05) == [] and benjamini_hochberg([0.06], 0.05) == [False]


def _sweep(rng, k: int, slow: int, factor: float, cv: float = 0.04, n: int = 10):
    """One simulated sweep of k configs, the first ``slow`` of them truly ``factor`` as fast:
    each side's values, and its results."""
    base = {f"c{i}": lognormal(rng, n, cv) for i in range(k)}
    cur = {f"c{i}": lognormal(rng, n, cv, scale=1000.0 * (factor if i < slow else 1.0)) for i in range(k)}
    return base, cur, results(base), results(cur)


def test_both_corrections_hold_alpha_on_simulated_nulls():
    """40 configs, none changed, 120 sweeps, alpha 0.05, threshold and noise floor 0 (every
    regressed verdict is false): Bonferroni's familywise rate and BH's false-discovery rate (the
    same thing when every config is null) stay within alpha plus three standard errors, where
    testing each config at alpha would raise an alarm in most sweeps."""
    rng = np.random.default_rng(2026)
    sweeps, k, alpha = 120, 40, 0.05
    alarms = {"bonferroni": 0, "bh": 0}
    uncorrected = 0
    for _ in range(sweeps):
        base, cur, base_results, cur_results = _sweep(rng, k, 0, 1.0)
        for correction in alarms:
            c = compare(base_results, cur_results, threshold=0.0, noise_floor=0.0, alpha=alpha, correction=correction)
            alarms[correction] += bool(c.regressed)
        uncorrected += any(p_below(base[i], cur[i], 1.0) <= alpha for i in base)
    limit = alpha + 3 * (alpha * (1 - alpha) / sweeps) ** 0.5
    assert alarms["bonferroni"] / sweeps <= limit and alarms["bh"] / sweeps <= limit, alarms
    assert uncorrected / sweeps > 0.5, uncorrected  # the test would see an uncontrolled gate


def test_bh_keeps_the_false_discovery_rate_and_finds_more_real_slowdowns():
    """40 configs of which 8 are truly 5% slower, CV 4%, 10 repeats, 120 sweeps, alpha 0.05:
    BH's share of false regressed verdicts averages within alpha, and it catches more of the
    real slowdowns than Bonferroni."""
    rng = np.random.default_rng(11)
    sweeps, k, slow, alpha = 120, 40, 8, 0.05
    fdp, found = [], {"bonferroni": 0, "bh": 0}
    for _ in range(sweeps):
        _, _, base, cur = _sweep(rng, k, slow, 0.95)
        for correction in found:
            c = compare(base, cur, threshold=0.0, noise_floor=0.0, alpha=alpha, correction=correction)
            flagged = {int(v.config_id[1:]) for v in c.regressed}
            found[correction] += sum(i < slow for i in flagged)
            if correction == "bh":
                fdp.append(sum(i >= slow for i in flagged) / max(1, len(flagged)))
    assert np.mean(fdp) <= alpha + 3 * np.std(fdp) / sweeps ** 0.5, np.mean(fdp)
    assert found["bh"] > 1.2 * found["bonferroni"], found


def test_bh_verdicts_the_interval_level_and_the_header(tmp_path):
    rng = np.random.default_rng(5)
    base = {f"c{i}": lognormal(rng, 10, 0.01) for i in range(10)}
    cur = {**{f"c{i}": lognormal(rng, 10, 0.01) for i in range(8)},
           "c8": lognormal(rng, 10, 0.02, scale=900.0), "c9": lognormal(rng, 10, 0.02, scale=1100.0)}
    c = compare(results(base), results(cur), correction="bh", threshold=0.05)
    verdicts = {v.config_id: v for v in c.verdicts}
    assert verdicts["c8"].verdict == "regressed" and verdicts["c9"].verdict == "improved"
    assert {v.verdict for k, v in verdicts.items() if k not in ("c8", "c9")} == {"unchanged"}
    assert c.correction == "bh" and c.alpha_per_config == pytest.approx(0.01 * 2 / 10)  # 2 flagged of 10
    assert verdicts["c8"].ci_high < 0.99 and verdicts["c9"].ci_low > 1.01  # beyond the noise floor
    flags = bh_flags({k: (base[k], cur[k]) for k in base}, METRICS["step_time"], 0.01, 0.01)
    assert flags["c8"] == "improved" and flags["c9"] == "regressed"  # lower is better: the directions swap
    a, b = write_run(tmp_path / "a", base), write_run(tmp_path / "b", cur)
    proc = run_cli(["compare", str(a), str(b), "--correction", "bh", "--json", "v.json", "--markdown", "v.md"],
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Benjamini-Hochberg: alpha is the false discovery rate over 10 compared" in proc.stdout
    assert "Benjamini-Hochberg" in (tmp_path / "v.md").read_text()
    assert json.loads((tmp_path / "v.json").read_text())["correction"] == "bh"
    proc = run_cli(["compare", str(a), str(b)], cwd=tmp_path)
    assert "Bonferroni: alpha is the familywise error rate, 0.001 per config over 10 compared" in proc.stdout
    proc = run_cli(["compare", str(a), str(b), "--correction", "holm"], cwd=tmp_path)
    assert proc.returncode == 2 and "--correction: invalid choice: 'holm'" in proc.stderr


def test_missing_new_and_failed_configs():
    rng = np.random.default_rng(0)
    base = results({"a": lognormal(rng, 8, 0.01), "gone": lognormal(rng, 8, 0.01)})
    cur = results({"a": lognormal(rng, 8, 0.01), "fresh": lognormal(rng, 8, 0.01)})
    cur += results({"gone": [1.0]}, status="error")
    verdicts = {v.config_id: v for v in compare(base, cur).verdicts}
    assert verdicts["a"].verdict == "unchanged"
    assert verdicts["gone"].verdict == "missing" and verdicts["gone"].note.startswith("error")
    assert verdicts["fresh"].verdict == "new" and verdicts["fresh"].note == "not in baseline"


def test_no_config_in_common_is_an_error_not_a_pass():
    rng = np.random.default_rng(1)
    base = results({"a": lognormal(rng, 6, 0.01), "b": lognormal(rng, 6, 0.01)})
    renamed = results({"a2": lognormal(rng, 6, 0.01)})
    with pytest.raises(InputError, match=r"^baseline vs current: no config is in both \(2: a, \.\.\. in baseline, "
                                         r"1: a2 in current\); configs are matched by config_id$"):
        compare(base, renamed)
    verdicts = compare(base, renamed + results({"b": lognormal(rng, 6, 0.01)})).verdicts  # some in common: as before
    assert [(v.config_id, v.verdict) for v in verdicts] == [("a", "missing"), ("b", "unchanged"), ("a2", "new")]
    # the same configs, but each measured on one side only: nothing compared either
    crossed_base = results({"a": lognormal(rng, 6, 0.01)}) + results({"b": [1.0]}, status="error")
    crossed_cur = results({"a": [1.0]}, status="error") + results({"b": lognormal(rng, 6, 0.01)})
    with pytest.raises(InputError, match=r"no config has an ok result with 'throughput' on both sides"):
        compare(crossed_base, crossed_cur)


def test_too_few_repeats_is_an_error_saying_how_many():
    with pytest.raises(InputError, match=r"configs have 1 repeat\(s\).*needs at least 5 repeats per side "
                                         r"\(gpubench run --repeats 5\)"):
        compare(results({"a": [1.0]}), results({"a": [1.0]}))
    with pytest.raises(InputError, match="no ok result has the metric 'energy_per_sample'"):
        compare(results({"a": [1.0] * 6}), results({"a": [1.0] * 6}), "energy_per_sample")


def test_peak_memory_growth_is_a_regression():
    base = results({"a": [1000.0] * 6}, memory=1e9)
    cur = results({"a": [1000.0] * 6}, memory=1.2e9)
    (v,) = compare(base, cur, "peak_memory").verdicts
    assert v.verdict == "regressed" and v.ratio == pytest.approx(1.2)


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.05", 0.05), ("2.5 %", 0.025), ("0", 0.0)])
def test_parse_fraction(text, value):
    assert parse_fraction(text, "--threshold") == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "-5%", "150%", "5%%", ""])
def test_parse_fraction_errors(text):
    with pytest.raises(InputError, match="--threshold"):
        parse_fraction(text, "--threshold")


def test_fingerprint_differences():
    a = {"cpu_model": "X", "gpus": [{"name": "H100", "driver": "550"}],
         "frameworks": {"torch": {"version": "2.11", "build": {"cuda": "12.8"}}}}
    b = {"cpu_model": "X", "gpus": [{"name": "H100", "driver": "560"}],
         "frameworks": {"torch": {"version": "2.12", "build": {"cuda": "12.8"}}}}
    diffs = fingerprint_differences(a, b, {"torch"})
    assert any("GPUs/driver" in d for d in diffs) and "torch version: 2.11 vs 2.12" in diffs
    assert fingerprint_differences(a, a, {"torch"}) == []


# --- the CLI --------------------------------------------------------------------------------

def write_run(path, values, env=ENV, telemetry=None):
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"run_id": path.name, "created_at": "now", "env": env}))
    (path / "results.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n"
                                                for r in results(values, path.name, telemetry=telemetry, env=env)))
    return path


def test_cli_compare_exit_codes_and_outputs(tmp_path):
    rng = np.random.default_rng(3)
    a = write_run(tmp_path / "a", {"cnn": lognormal(rng, 10, 0.02), "mlp": lognormal(rng, 10, 0.02)})
    b = write_run(tmp_path / "b", {"cnn": lognormal(rng, 10, 0.02), "mlp": lognormal(rng, 10, 0.02)})
    slow = write_run(tmp_path / "slow", {"cnn": lognormal(rng, 10, 0.02, scale=900.0),
                                         "mlp": lognormal(rng, 10, 0.02)})
    proc = run_cli(["compare", str(a), str(b)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no regression" in proc.stdout
    proc = run_cli(["compare", str(a), str(slow), "--markdown", "s.md", "--json", "s.json", "--junit", "s.xml"],
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REGRESSION" in proc.stdout
    md = (tmp_path / "s.md").read_text()
    assert "## gpubench compare: **regression**" in md and "| cnn | **regressed** |" in md
    data = json.loads((tmp_path / "s.json").read_text())
    verdicts = {v["config_id"]: v for v in data["verdicts"]}
    assert verdicts["cnn"]["verdict"] == "regressed" and verdicts["cnn"]["ratio"] == pytest.approx(0.9, abs=0.02)
    assert data["alpha_per_config"] == pytest.approx(0.005)
    # what the comparison could see: its own between-process noise, and the slowdown caught 95% of the time
    line = next(x for x in proc.stdout.splitlines() if x.startswith("noise between processes in this comparison"))
    noise, mde = (float(v) for v in re.findall(r"([\d.]+)%", line)[:2])
    assert 1.0 < noise < 3.5 and 3.0 < mde < 10.0, line
    assert "with 10 repeats a side at this gate's settings" in line and line in md
    assert all(0.01 < v["noise"] < 0.035 for v in data["verdicts"])
    # the JUnit test report: one case per config, the regression a failure with its triage
    suite = ElementTree.parse(tmp_path / "s.xml").getroot()
    assert (suite.tag, suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("testsuite", "2", "1", "0")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["correction"] == "bonferroni" and props["alpha"] == "0.01" and props["power"] == line
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    failure = cases["cnn"].find("failure")
    change = f"regressed: {100 * (verdicts['cnn']['ratio'] - 1):+.1f}% ["
    assert failure is not None and failure.get("message").startswith(change)
    assert "python -m gpubench compare" in failure.text  # the triage's reproduce command
    assert cases["mlp"].find("failure") is None and cases["mlp"].find("system-out").text.startswith("unchanged: ")


def test_cli_refuses_different_environments_unless_forced(tmp_path):
    rng = np.random.default_rng(4)
    a = write_run(tmp_path / "a", {"cnn": lognormal(rng, 6, 0.01)})
    other = {**ENV, "frameworks": {"torch": {"version": "2.14.0", "build": {}}}}
    b = write_run(tmp_path / "b", {"cnn": lognormal(rng, 6, 0.01)}, env=other)
    proc = run_cli(["compare", str(a), str(b)], cwd=tmp_path)
    assert proc.returncode == 2 and "different environments (torch version: 2.13.0 vs 2.14.0)" in proc.stderr
    proc = run_cli(["compare", str(a), str(b), "--force"], cwd=tmp_path)
    assert proc.returncode == 0 and "warning: environments differ (--force)" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["compare", "nope", "{a}"], "nope: no such run directory or saved baseline"),
    (["compare", "{a}", "{a}", "--threshold", "abc"], "--threshold abc: expected a percentage"),
    (["compare", "{a}", "{a}", "--metric", "speed"], "--metric speed: expected one of: throughput, step_ms (or step_time), peak_memory_bytes (or peak_memory)"),
    (["compare", "{a}", "{a}", "--noise-floor", "10%"], "--noise-floor 10% is above --threshold 3%"),
    (["compare", "{one}", "{one}"], "needs at least 5 repeats per side (gpubench run --repeats 5)"),
    (["compare", "{a}", "{other}"], "no config is in both (1: cnn in {a}, 1: mlp in {other}); configs are matched by"),
])
def test_cli_compare_bad_input(tmp_path, args, message):
    a = write_run(tmp_path / "a", {"cnn": [1000.0] * 6})
    one = write_run(tmp_path / "one", {"cnn": [1000.0]})
    other = write_run(tmp_path / "other", {"mlp": [1000.0] * 6})
    message = message.format(a=a, other=other)
    proc = run_cli([x.format(a=a, one=one, other=other) for x in args], cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_cli_baselines(tmp_path):
    rng = np.random.default_rng(5)
    a = write_run(tmp_path / "a", {"cnn": lognormal(rng, 6, 0.01)})
    assert run_cli(["baseline", "save", str(a), "main"], cwd=tmp_path).returncode == 0
    assert (tmp_path / ".gpubench" / "baselines" / "main" / "results.jsonl").exists()
    again = run_cli(["baseline", "save", str(a), "main"], cwd=tmp_path)
    assert again.returncode == 2 and "exists; use --force" in again.stderr
    listed = run_cli(["baseline", "list"], cwd=tmp_path)
    assert "main: run a" in listed.stdout and "1 configs, 6 repeat(s)" in listed.stdout
    proc = run_cli(["compare", "main", str(a)], cwd=tmp_path)
    assert proc.returncode == 0 and "baseline main" in proc.stdout
    bad = run_cli(["baseline", "save", str(tmp_path / "missing"), "x"], cwd=tmp_path)
    assert bad.returncode == 2 and "no such run directory" in bad.stderr


def test_cli_a_result_line_of_the_wrong_shape_is_named_not_skipped(tmp_path):
    rng = np.random.default_rng(6)
    a = write_run(tmp_path / "a", {"cnn": lognormal(rng, 6, 0.01)})
    b = write_run(tmp_path / "b", {"cnn": lognormal(rng, 6, 0.01)})
    lines = (b / "results.jsonl").read_text().splitlines(keepends=True)
    lines[2] = json.dumps({**json.loads(lines[2]), "status": "fine"}) + "\n"  # once dropped: "5 repeat(s)..."
    (b / "results.jsonl").write_text("".join(lines))
    proc = run_cli(["compare", str(a), str(b)], cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{b / 'results.jsonl'}:3: status 'fine': expected one of: ok, oom" in proc.stderr
    assert "repeat(s)" not in proc.stderr
    for args in (["baseline", "save", str(b), "broken"], ["export", str(b), "--format", "github-action"]):
        proc = run_cli(args, cwd=tmp_path)
        assert proc.returncode == 2 and "results.jsonl:3: status 'fine'" in proc.stderr, proc.stderr
    assert not (tmp_path / ".gpubench" / "baselines" / "broken").exists()
    saved = tmp_path / ".gpubench" / "baselines" / "copied"  # a baseline damaged after it was saved
    saved.mkdir(parents=True)
    for name in ("run.json", "results.jsonl"):
        (saved / name).write_text((b / name).read_text())
    listed = run_cli(["baseline", "list"], cwd=tmp_path)
    assert listed.returncode == 0 and "results.jsonl:3: status 'fine'" in listed.stdout, listed.stdout + listed.stderr


# --- triage of a regressed verdict ---------------------------------------------------------------

def telemetry_of(sm_clock: float, throttled: float, power: float, others_cores: float) -> dict:
    return {"gpu": {"sm_clock_mean_mhz": sm_clock, "throttled_fraction": throttled, "util_mean": 95.0,
                    "power_mean_w": power},
            "host": {"cpu_percent_mean": 100.0, "others_cores": others_cores}}


def test_triage_names_a_slower_clock_and_throttling_as_the_machine():
    from gpubench.gate.triage import triage

    rng = np.random.default_rng(8)
    base = results({"cnn": lognormal(rng, 10, 0.02)}, telemetry=telemetry_of(1980, 0.0, 600, 0.1))
    cur = results({"cnn": lognormal(rng, 10, 0.02, scale=880.0)}, telemetry=telemetry_of(1740, 0.4, 480, 0.1))
    lines = triage(base, cur, "cnn", ("baseline", "current"), "python -m gpubench compare a b")
    assert "telemetry: current's SM clock is 12.1% lower (1,740 MHz against 1,980)" in lines
    assert "telemetry: current's GPU power is 20.0% lower (480 W against 600)" in lines
    assert "telemetry: of its GPU samples throttled: 40% on current against 0% on baseline" in lines
    assert any(x.startswith("the machine, not the code, is the likelier cause") for x in lines)
    assert lines[-1] == "reproduce: python -m gpubench compare a b" and lines[-2].startswith("phases: ")
    # other processes busier, same clocks: the machine again
    busy = results({"cnn": lognormal(rng, 10, 0.02, scale=880.0)}, telemetry=telemetry_of(1980, 0.0, 600, 0.9))
    lines = triage(base, busy, "cnn", ("baseline", "current"), "x")
    assert "telemetry: CPU other processes used (100% = one core): 90% on current against 10% on baseline" in lines
    assert any(x.startswith("the machine, not the code") for x in lines)


def test_triage_of_a_different_driver_and_of_no_difference():
    from gpubench.gate.triage import triage

    rng = np.random.default_rng(9)
    gpu_env = {**ENV, "gpus": [{"name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04"}]}
    other = {**gpu_env, "gpus": [{"name": "NVIDIA H100 80GB HBM3", "driver": "575.57.08"}],
             "env_vars": {"OMP_NUM_THREADS": "4"}}
    same = telemetry_of(1980, 0.0, 600, 0.1)
    base = results({"cnn": lognormal(rng, 10, 0.02)}, telemetry=same, env=gpu_env)
    cur = results({"cnn": lognormal(rng, 10, 0.02, scale=880.0)}, telemetry=same, env=other)
    lines = triage(base, cur, "cnn", ("baseline", "current"), "x")
    assert any(x.startswith("environment: GPUs/driver: [('NVIDIA H100 80GB HBM3', '580.159.04')]") for x in lines)
    assert "environment: thread variables: {} (baseline) vs {'OMP_NUM_THREADS': '4'} (current)" in lines
    assert any(x.startswith("the machine, not the code") for x in lines)
    cur = results({"cnn": lognormal(rng, 10, 0.02, scale=880.0)}, telemetry=same, env=gpu_env)
    lines = triage(base, cur, "cnn", ("baseline", "current"), "x")
    assert lines[0] == "no difference in the recorded environment or telemetry: the code is the likelier cause"


def test_triage_names_the_users_model_file_only_where_the_sides_differ():
    """A factory's file (its SHA-1) on each side: named where the two differ, not where they
    are the same code in two checkouts."""
    from gpubench.config import Config
    from gpubench.gate.triage import triage
    from tests.conftest import make_result

    config = Config(workload="mymodels:net", input_shape=(3, 8, 8))

    def side(sha1: str, file: str) -> list[Result]:
        found = [make_result(config, rate=100.0 + i, repeat=i) for i in range(3)]
        for r in found:
            r.model = {"origin": {"module": "mymodels", "function": "net", "file": file, "file_sha1": sha1}}
        return found

    labels = ("baseline", "candidate")
    same = triage(side("a" * 40, "/base/mymodels.py"), side("a" * 40, "/head/mymodels.py"), config.config_id, labels,
                  "x")
    assert same and not any(x.startswith("model code:") for x in same)
    changed = triage(side("a" * 40, "/base/mymodels.py"), side("b" * 40, "/head/mymodels.py"), config.config_id,
                     labels, "x")
    assert ("model code: mymodels.net differs: /base/mymodels.py (sha1 aaaaaaaaaa, baseline) vs /head/mymodels.py "
            "(sha1 bbbbbbbbbb, candidate)") in changed


def test_compare_prints_the_triage_of_each_regressed_config(tmp_path):
    rng = np.random.default_rng(10)
    a = write_run(tmp_path / "a", {"cnn": lognormal(rng, 10, 0.02), "mlp": lognormal(rng, 10, 0.02)},
                  telemetry=telemetry_of(1980, 0.0, 600, 0.1))
    b = write_run(tmp_path / "b", {"cnn": lognormal(rng, 10, 0.02, scale=880.0), "mlp": lognormal(rng, 10, 0.02)},
                  telemetry=telemetry_of(1740, 0.4, 600, 0.1))
    proc = run_cli(["compare", str(a), str(b), "--markdown", "t.md", "--json", "t.json"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "triage cnn:" in out and "b's SM clock is 12.1% lower (1,740 MHz against 1,980)" in out
    assert f"reproduce: python -m gpubench compare {a} {b} --threshold 3% --noise-floor 1% --alpha 0.01" in out
    assert "triage mlp" not in out  # only regressed configs
    md = (tmp_path / "t.md").read_text()
    assert "### Triage: cnn" in md and f"- telemetry: {b}'s SM clock is 12.1% lower" in md
    data = json.loads((tmp_path / "t.json").read_text())
    assert set(data["triage"]) == {"cnn"} and data["triage"]["cnn"][-1].startswith("reproduce: ")


def test_a_tensor_core_counter_that_drops_to_zero_is_a_regression_not_missing():
    """The gate works on logs; tensor_active_pct counts a reading under 0.1% as 0.1% (its
    floor), so matrix products moved off the tensor cores regress instead of going missing."""
    from dataclasses import replace

    from gpubench.config import Config
    from tests.conftest import make_result

    config = Config(framework="torch", workload="mlp", device="cuda")

    def side(pct: float, run: str) -> list[Result]:
        out = []
        for i in range(8):
            r = make_result(config, 100.0, repeat=i, run_id=run)
            out.append(replace(r, telemetry={"gpu": {"tensor_active_pct_mean": pct + 0.01 * i if pct else 0.0}}))
        return out

    c = compare(side(40.0, "a"), side(0.0, "b"), "tensor_active_pct", 0.03, 0.01, 0.01)
    (v,) = c.verdicts
    assert v.verdict == "regressed" and v.ratio == pytest.approx(0.1 / 40.0, rel=0.01)
    same = compare(side(40.0, "a"), side(40.0, "b"), "tensor_active_pct", 0.03, 0.01, 0.01)
    assert same.verdicts[0].verdict == "unchanged"


def test_a_count_that_every_repeat_agrees_on_is_compared_exactly():
    """graph_breaks and recompiles are the same in every repeat: one repeat a side decides
    (0 -> 1 regresses: the floor counts 0 as 0.5); where a side's repeats disagree, the
    statistics and their repeats apply as for any metric."""
    from gpubench.config import Config
    from tests.conftest import make_result

    config = Config(workload="mlp", compile="torch-compile")

    def side(*breaks: int) -> list[Result]:
        return [make_result(config, 100.0, repeat=i, graph_breaks=b, recompiles=0) for i, b in enumerate(breaks)]

    (v,) = compare(side(0), side(1), "graph_breaks").verdicts
    assert (v.verdict, v.ratio, v.n_baseline, v.n_current) == ("regressed", 2.0, 1, 1) and v.note.startswith("exact")
    assert compare(side(2), side(1), "graph_breaks").verdicts[0].verdict == "improved"
    assert compare(side(0, 0), side(0), "recompiles").verdicts[0].verdict == "unchanged"
    with pytest.raises(InputError, match="needs at least 5 repeats per side"):
        compare(side(0, 1), side(1, 1), "graph_breaks")  # the baseline's repeats disagree
