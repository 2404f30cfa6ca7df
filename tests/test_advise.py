"""gpubench advise: the practices that apply, each measured against the baseline with the gate's
statistics, the ranking, the quality guard, the measured combination, the memory follow-ups,
the budget, --resume, bad input; on the test backend whose practices have known effects
(tests/plugins/fake.py: FakeAdviseBackend), then on real small models (slow)."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpubench.advise.judge import Judging, Row, combine, judge, payback, rank
from gpubench.advise.practices import Practice
from gpubench.env import usable_cores
from tests.conftest import REPO, make_result, plain_env, plugin_env, result_lines, run_cli

SUITE = """
name = "fadv"
[defaults]
framework = "fake-advise"
workload = "fault"
batch_size = 8
warmup_steps = 1
steps = 20
window_s = 0.02
windows = 2
timeout_s = 20
"""


def advice_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "advice.json").read_text())


def rows_by_name(advice: dict) -> dict[str, dict]:
    return {r["practice"]: r for r in advice["rows"]}


@pytest.fixture(scope="module")
def advised(tmp_path_factory):
    """One advise of the fake backend: every practice group, a 10% threshold (its steps sleep a
    fixed time, so the practices decide at the first look). Its windows are bounded by time
    (window_s): a faster practice may take more steps than the baseline, a slower one fewer,
    with the same arithmetic, and none of them may be judged to learn worse for it."""
    tmp = tmp_path_factory.mktemp("advise")
    (tmp / "s.toml").write_text(SUITE)
    proc = run_cli(["advise", "s.toml", "--budget", "120", "--threshold", "10%", "--markdown", "advice.md",
                    "--json", "advice.json"], cwd=tmp)
    (run_dir,) = list((tmp / "runs").iterdir())
    return tmp, proc, run_dir


def test_advise_measures_ranks_and_guards_each_practice(advised):
    tmp, proc, run_dir = advised
    assert proc.returncode == 0, proc.stdout + proc.stderr
    advice = advice_of(run_dir)
    rows = rows_by_name(advice)
    verdicts = {name: r["verdict"] for name, r in rows.items()}
    # a CPU config: half the cores this process may use (the fake's steps sleep: the same speed)
    threads = f"threads {max(1, usable_cores() // 2)}"
    assert verdicts == {"batch x2": "improved", "optimizer fused": "improved", "memory format channels-last":
                        "unchanged", "optimizer foreach": "unchanged", "compile xla": "regressed",
                        "precision tf32": "learns worse", "precision amp-bf16": "diverged", threads: "unchanged"}
    assert rows[threads]["sets"] == {"threads": max(1, usable_cores() // 2)}
    # the known effects, inside each interval: a step of 1.4 ms against 2 ms, and twice the samples a step
    fused, batch, xla = rows["optimizer fused"], rows["batch x2"], rows["compile xla"]
    assert fused["ci_low"] <= 2 / 1.4 * 1.05 and fused["ci_high"] >= 2 / 1.4 * 0.9
    assert batch["ci_low"] < 2.0 < batch["ci_high"] * 1.05 and xla["ci_high"] < 0.9
    assert "above the tolerance of 10%" in rows["precision tf32"]["reason"]
    # the losses were compared after the same samples: the fewest any repeat of the baseline and
    # the practice judged together trained (8 a step), whatever their time-bounded windows' step
    # counts (the baseline's repeats of later rounds, the combination's, may have taken fewer)
    steps: dict[str, list[int]] = {}
    for r in result_lines(run_dir):
        if r["status"] == "ok":
            steps.setdefault(r["config_id"], []).append(len(r["metrics"]["loss"]["curve"]))
    for name in ("optimizer fused", "optimizer foreach", "compile xla", "memory format channels-last"):
        row = rows[name]
        compared, rest = divmod(row["loss_samples"], 8)
        assert rest == 0 and compared <= min(steps[row["config_id"]]), name
        assert compared in steps[advice["baseline"]] + steps[row["config_id"]], name
    assert "LR" not in batch["caveat"] and "learning rate is left as it is" in batch["caveat"]
    # ranked: improved (fastest first), unchanged, regressed, then what must never be recommended
    assert [r["practice"] for r in advice["rows"]][:2] == ["batch x2", "optimizer fused"]
    assert [r["verdict"] for r in advice["rows"]][-3:] == ["regressed", "learns worse", "diverged"]
    # the combination is measured (never computed), and it is the best config here
    combo = advice["combination"]
    assert combo["practice"] == "batch x2 + optimizer fused" and combo["verdict"] == "improved"
    assert combo["repeats"][1] >= 6 and combo["ci_low"] > 2.0
    assert advice["best"]["practice"] == combo["practice"]
    assert advice["best_lines"] == ["batch_size = 16", 'optimizer_impl = "fused"']
    # what does not apply says why in one line
    skipped = {s["name"]: s["reason"] for s in advice["skipped"]}
    assert "no input pipeline to tune" in skipped["input pipeline"]
    assert "the batch x2 fits" in skipped["checkpointing, accumulation"]
    out = proc.stdout
    assert "best: batch x2 + optimizer fused" in out and "in the suite's [defaults]:" in out
    assert "  batch_size = 16" in out and "--set batch_size=16 --set optimizer_impl=fused" in out


def test_advise_writes_markdown_json_and_a_report_section(advised):
    tmp, proc, run_dir = advised
    md = (tmp / "advice.md").read_text()
    assert md == (run_dir / "advice.md").read_text()
    assert "| 1 | batch x2 | improved |" in md and "## Does not apply" in md and 'optimizer_impl = "fused"' in md
    assert json.loads((tmp / "advice.json").read_text()) == advice_of(run_dir)
    html = (tmp / "reports" / run_dir.name / "index.html").read_text()
    assert 'id="advice"' in html and "batch x2 + optimizer fused" in html
    # every measurement is an ordinary result of the run directory: no (config, repeat) twice
    lines = result_lines(run_dir)
    keys = [(x["config_id"], x["repeat"]) for x in lines]
    assert len(keys) == len(set(keys))


def test_with_a_target_advise_judges_on_the_time_to_it_and_measures_the_learning_rate_of_a_larger_batch(tmp_path):
    """With target_loss, every practice is judged on its time to the target (the speed-up: the
    baseline's time over the practice's), and batch x2 is measured three ways. The fake's SGD
    takes twice the samples a step at the same step time: with the rate kept it reaches the
    target no sooner; scaled linearly (with warm-up) about twice as soon; by the square root
    in between. tf32 (its steps climb the loss) never reaches it, amp-bf16 diverges."""
    (tmp_path / "s.toml").write_text(SUITE)
    proc = run_cli(["advise", "s.toml", "--set", "target_loss=0.9", "--set", "eval_every=5", "--set", "max_steps=400",
                    "--only", "batch", "--only", "precision", "--budget", "60", "--threshold", "25%", "--no-report"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    advice = advice_of(run_dir)
    rows = rows_by_name(advice)
    linear, root = "batch x2, lr x2 (linear, warm-up 5 steps)", "batch x2, lr x1.41 (square root, warm-up 5 steps)"
    assert advice["judged_on"] == "time_to_target_s"
    verdicts = {name: r["verdict"] for name, r in rows.items()}
    # the rate kept: no sooner (unchanged; on a loaded machine its interval may stay too wide to say)
    assert verdicts.pop("batch x2, lr kept") in ("unchanged", "inconclusive")
    assert verdicts == {linear: "improved", root: "improved", "precision tf32": "target_not_reached",
                        "precision amp-bf16": "diverged"}
    assert rows[linear]["sets"] == {"batch_size": 16, "lr": 0.002, "lr_warmup_steps": 5}
    assert rows[root]["sets"] == {"batch_size": 16, "lr": 0.00141421, "lr_warmup_steps": 5}
    assert rows[linear]["speedup"] > 1.5 and 1.1 < rows[root]["speedup"] < rows[linear]["speedup"]
    assert rows["batch x2, lr kept"]["speedup"] < 1.25
    assert "target_loss 0.9 not reached" in rows["precision tf32"]["reason"]
    # the figures judged are the results' own: each practice's time to the target against the
    # baseline's, repeat by repeat (each repeat a trial of its own seeds, the same on both sides)
    results = result_lines(run_dir)
    times = {(r["config_id"], r["repeat"]): r["metrics"]["target"]["time_to_target_s"] for r in results
             if r["status"] == "ok"}
    trials = {r["repeat"]: r["runtime"]["trial"]["data_draw"] for r in results if r["status"] == "ok"}
    assert trials[0] == 0 and len(set(trials.values())) == len(trials) >= 5
    base = [times[advice["baseline"], k] for k in range(5)]
    mine = [times[rows[linear]["config_id"], k] for k in range(5)]
    assert rows[linear]["ci_low"] < sorted(base)[2] / sorted(mine)[2] < rows[linear]["ci_high"]
    assert advice["best"]["practice"] == linear and "as fast to the target as the baseline" in proc.stdout
    assert "speed-up: the baseline's time to target / the practice's" in " ".join(proc.stdout.split())


@pytest.mark.slow
def test_where_the_larger_batch_does_not_fit_checkpointing_and_accumulation_are_measured(tmp_path):
    (tmp_path / "s.toml").write_text(SUITE)
    # 10 ms steps: a step's own cost besides the sleep (larger on a loaded machine) stays a small
    # part of it, so accumulation's ratio stays near 1 and not above the threshold
    proc = run_cli(["advise", "s.toml", "--only", "batch", "--only", "memory", "--budget", "150", "--threshold",
                    "10%", "--no-report"], cwd=tmp_path, env=plugin_env(FAKE_MAX_BATCH="8", FAKE_STEP_SLEEP_MS="10"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    rows = rows_by_name(advice_of(run_dir))
    assert rows["batch x2"]["verdict"] == "oom"
    ckpt, accum = rows["batch x2 + checkpointing"], rows["grad-accum:2"]
    # twice the samples a step at 1.5x the step time (with a step's own fixed cost besides the
    # sleep, a little better than 4/3); twice the samples at twice the time
    assert ckpt["verdict"] == "improved" and ckpt["ci_low"] < 4 / 3 * 1.05 and ckpt["ci_high"] > 4 / 3 * 0.95
    assert accum["verdict"] == "unchanged"


def test_the_budget_bounds_the_rounds_and_an_undecided_practice_says_so(tmp_path):
    (tmp_path / "s.toml").write_text(SUITE)
    t0 = time.monotonic()
    proc = run_cli(["advise", "s.toml", "--only", "memory_format", "--budget", "1", "--no-report"], cwd=tmp_path)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    (row,) = advice_of(run_dir)["rows"]
    assert row["verdict"] == "inconclusive" and "too few for an interval" in row["reason"]
    assert "the budget (1 s) is spent" in proc.stdout
    # its figure marked undecided, and the best config "for now", never a plain verdict
    assert "(undecided)" in proc.stdout and "best: the config as it is, for now" in proc.stdout
    assert "undecided: memory format channels-last" in proc.stdout
    assert took < 60  # a few workers, not the rounds an interval needs


@pytest.mark.slow
def test_ctrl_c_keeps_the_measurements_and_resume_goes_on(tmp_path):
    (tmp_path / "s.toml").write_text(SUITE)
    cmd = [sys.executable, "-m", "gpubench", "advise", "s.toml", "--only", "optimizer", "--threshold", "10%",
           "--budget", "60", "--no-report"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=plugin_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    results = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = list((tmp_path / "runs").glob("*/results.jsonl"))
        # complete lines only: a line being written has no newline yet, and readers skip it
        if found and found[0].read_text().count("\n") >= 5:
            results = found[0]
            break
        time.sleep(0.2)
    assert results is not None
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    run_dir = results.parent
    assert f"go on with: gpubench advise --resume runs/{run_dir.name}" in err.replace("\n", "")
    kept = len(result_lines(run_dir))
    assert kept >= 5 and not (run_dir / "advice.json").exists()
    again = run_cli(["advise", "--resume", str(run_dir), "--no-report"], cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    advice = advice_of(run_dir)
    assert {r["practice"]: r["verdict"] for r in advice["rows"]} == {"optimizer fused": "improved",
                                                                     "optimizer foreach": "unchanged"}
    keys = [(x["config_id"], x["repeat"]) for x in result_lines(run_dir)]
    assert len(keys) == len(set(keys)) and len(keys) > kept


def test_a_baseline_that_does_not_train_exits_1(tmp_path):
    (tmp_path / "s.toml").write_text(SUITE.replace('workload = "fault"', 'workload = "fault"\nmode = 1'))
    proc = run_cli(["advise", "s.toml", "--only", "optimizer", "--no-report"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the baseline does not train" in proc.stdout and "injected failure in build" in proc.stdout
    (run_dir,) = list((tmp_path / "runs").iterdir())
    assert "injected failure" in advice_of(run_dir)["baseline_failed"]


@pytest.mark.parametrize("args,message", [
    (["--set", "batch_size=8,16"], "advise measures one config; with these --set the suite makes 2"),
    (["--only", "speed"], "--only speed: unknown practice group; one of: precision, compile"),
    (["--only", "batch", "--skip", "batch"], "every group named is skipped, so nothing would be measured"),
    (["--set", "batch_size=max"], 'batch_size: "max" is not for gpubench advise'),
    (["--alpha", "0.7"], "--alpha 0.7: must be above 0 and below 0.5"),
    (["--loss-tolerance", "lots"], "--loss-tolerance lots: expected a percentage"),
])
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(tmp_path, args, message):
    (tmp_path / "s.toml").write_text(SUITE)
    proc = run_cli(["advise", "s.toml", *args], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and proc.stderr.strip().count("\n") == 0
    assert not (tmp_path / "runs").exists()


# --- the judging, with scripted results ------------------------------------------------------

def _results(config, rates, **metrics):
    return [make_result(config, rate, repeat=i, **metrics) for i, rate in enumerate(rates)]


def test_judge_gives_the_gates_interval_and_the_guard_overrides_a_speed_up():
    from dataclasses import replace

    from gpubench.config import Config

    base_c = Config(framework="torch", workload="mlp", device="cpu")
    fast_c = replace(base_c, batch_size=128)
    j = Judging(alpha=0.05, threshold=0.03, noise_floor=0.01, loss_tolerance=0.10)
    # the baseline's 10 steps of 64 samples, the practice's 10 of 128: compared after 640 samples,
    # the baseline's 10th step and the practice's 5th
    base = _results(base_c, [100, 101, 99, 100.5, 99.5, 100, 100.2], loss={"curve": [2.0] * 9 + [1.0]},
                    samples_per_step=64)
    fast = _results(fast_c, [150, 151, 149, 150.5, 149.5, 150, 150.3],
                    loss={"curve": [2.0] * 4 + [1.05] + [0.5] * 5}, samples_per_step=128)
    p = Practice("batch x2", "batch", (("batch_size", 128),))
    row = judge(p, base, fast, j, compared=2)
    assert row.verdict == "improved" and row.speedup == pytest.approx(1.5, rel=0.01)
    assert row.ci_low < 1.5 < row.ci_high and row.repeats == (7, 7)
    assert row.loss_ratio == pytest.approx(1.05) and row.loss_samples == 640
    worse = _results(fast_c, [150, 151, 149, 150.5, 149.5, 150, 150.3],
                     loss={"curve": [2.0] * 4 + [1.2] + [0.5] * 5}, samples_per_step=128)
    bad = judge(p, base, worse, j, compared=2)
    # its last loss (0.5) is half the baseline's, after twice the samples
    assert bad.verdict == "learns worse" and "+20.0%" in bad.reason and "640 samples" in bad.reason
    assert not bad.helped
    few = judge(p, base[:2], fast[:2], j, compared=2)
    assert few.verdict == "inconclusive" and "too few for an interval (needs" in few.reason
    oom = judge(p, base, [make_result(fast_c, status="oom")], j, compared=2)
    assert oom.verdict == "oom" and oom.speedup is None


def test_the_guard_compares_losses_after_the_same_samples_not_the_same_time():
    """Two configs of the same arithmetic (the same loss at every step) whose time-bounded windows
    took different numbers of steps: the slower one's last loss is higher, yet it learns as
    well. The guard compares them after the samples both trained, and finds them equal."""
    from dataclasses import replace

    from gpubench.config import Config

    base_c = Config(framework="torch", workload="mlp", device="cpu")
    slow_c = replace(base_c, compile="torch-compile")
    curve = [1.0 / k for k in range(1, 31)]  # the loss after step k
    j = Judging(alpha=0.05, threshold=0.03, noise_floor=0.01, loss_tolerance=0.10)
    base = _results(base_c, [100.0] * 7, loss={"curve": curve, "last": curve[-1]}, samples_per_step=64)
    slow = _results(slow_c, [60.0] * 7, loss={"curve": curve[:18], "last": curve[17]}, samples_per_step=64)
    assert curve[17] / curve[-1] > 1.6  # compared last to last, the slower one would "learn worse"
    row = judge(Practice("compile torch-compile", "compile", (("compile", "torch-compile"),)), base, slow, j, 2)
    assert row.verdict == "regressed" and row.loss_ratio == pytest.approx(1.0)
    assert row.loss_samples == 18 * 64


def test_rounds_that_drift_are_compared_paired():
    """The machine drifts by up to 40% from round to round, the practice runs as fast as the
    baseline beside it (within 1%): paired by round, it is unchanged with a narrow interval;
    the same values without their rounds (no pairs) are only inconclusive."""
    from dataclasses import replace

    from gpubench.config import Config

    base_c = Config(framework="torch", workload="mlp", device="cpu")
    other_c = replace(base_c, optimizer_impl="foreach")
    j = Judging(alpha=0.05, threshold=0.03, noise_floor=0.01, loss_tolerance=0.10)
    drift = [100, 140, 110, 90, 130, 100, 120, 95, 135, 105]
    wobble = [1.005, 0.995, 1.0, 1.008, 0.992, 1.003, 0.997, 1.0, 1.004, 0.996]
    base = _results(base_c, drift)
    same = _results(other_c, [d * w for d, w in zip(drift, wobble)])
    p = Practice("optimizer foreach", "optimizer", (("optimizer_impl", "foreach"),))
    row = judge(p, base, same, j, compared=2)
    assert row.paired and row.verdict == "unchanged" and 0.97 < row.ci_low <= row.ci_high < 1.03
    apart = [make_result(other_c, r.metrics["throughput"]["median"], repeat=100 + i) for i, r in enumerate(same)]
    unpaired = judge(p, base, apart, j, compared=2)
    assert not unpaired.paired and unpaired.verdict == "inconclusive"


def test_an_undecided_practice_is_told_the_rounds_and_budget_that_would_decide_it(tmp_path):
    """From the noise of its rounds: the rounds after which a practice as fast as measured is
    likely decided (checked against fresh simulations of the gate's rule), and the --resume line."""
    from dataclasses import replace

    from gpubench.advise.command import budget_lines
    from gpubench.advise.judge import guide
    from gpubench.config import Config
    from gpubench.gate.power import verdict_share
    from gpubench.gate.stats import min_pairs

    base_c = Config(framework="torch", workload="mlp", device="cpu")
    other_c = replace(base_c, optimizer_impl="foreach")
    j = Judging(alpha=0.05, threshold=0.03, noise_floor=0.01, loss_tolerance=0.10)
    base = _results(base_c, [100, 92, 106, 97])
    slower = _results(other_c, [84, 90, 88, 94])  # about 0.90x, a round's ratio wandering by ~9%
    row = judge(Practice("optimizer foreach", "optimizer", (("optimizer_impl", "foreach"),)), base, slower, j,
                compared=2)
    assert row.verdict == "inconclusive" and row.spread == pytest.approx(0.0889, abs=0.001)
    guide(row, 0.05 / 4 / 2, j)
    need = row.rounds_needed
    assert need is not None and need > min_pairs(2 * 0.05 / 8)  # more than the fewest an interval needs
    decided = frozenset({"improved", "regressed", "unchanged"})
    assert verdict_share(row.spread, need, row.speedup, 0.05 / 8, 0.03, 0.01, decided, 200, seed=7, paired=True) >= 0.7
    assert verdict_share(row.spread, need // 2, row.speedup, 0.05 / 8, 0.03, 0.01, decided, 200, seed=7,
                         paired=True) < 0.8
    lines = budget_lines([row], 12.0, tmp_path / "RUN")
    assert lines[0].startswith("undecided: optimizer foreach, 0.904x measured over 4 round(s) at 8.9% noise") and f"about {need - 4} more round(s)" in lines[0]
    minutes = math.ceil(2 * (need - 4) * 12.0 / 60)
    assert lines[1] == (f"to decide them: about {minutes} min more at 12 s a measurement; go on with: gpubench "
                        f"advise --resume {tmp_path / 'RUN'} --budget {math.ceil(1.25 * 2 * (need - 4) * 12.0 / 60)}m")
    # at the threshold: no number of rounds decides it
    edge = Row("x", "optimizer", {}, "x", "inconclusive", speedup=1.03, repeats=(4, 4), spread=0.05)
    guide(edge, 0.05 / 8, j)
    assert edge.rounds_needed is None and "would not likely decide it" in budget_lines([edge], 12.0, tmp_path)[0]


def test_rank_and_combine_take_the_best_of_each_group():
    def row(name, group, verdict, speedup):
        return Row(name, group, {name: 1}, name, verdict, speedup=speedup)

    rows = [row("a", "precision", "improved", 1.2), row("b", "precision", "improved", 1.5),
            row("c", "compile", "regressed", 0.5), row("d", "batch", "improved", 1.1),
            row("e", "compile", "unchanged", 1.0), row("f", "optimizer", "diverged", None),
            row("g", "memory", "learns worse", 2.0)]
    assert [r.practice for r in rank(rows)] == ["b", "a", "d", "e", "c", "g", "f"]
    assert [r.practice for r in combine(rows)] == ["b", "d"]  # never the one that learns worse


def test_payback_in_baseline_steps():
    assert payback(1000.0, 10.0, 64, 64 * 1000 / 5.0) == pytest.approx(200.0)  # 5 ms saved a step
    assert payback(-5.0, 10.0, 64, 9000.0) == 0.0
    assert math.isinf(payback(1000.0, 10.0, 64, 64 * 1000 / 12.0))
    assert payback(1000.0, None, 64, 100.0) is None


# --- real small models (slow) ----------------------------------------------------------------

@pytest.mark.slow
def test_advise_on_a_users_language_model_measures_precision_and_the_optimizer(tmp_path):
    """The acceptance corpus' GPT (a factory of token ids that computes its own loss:
    tests/corpus/gpt.py), bf16 autocast and the optimizer implementations measured against it in
    real PyTorch workers, as advise measures any model (how each practice group is judged,
    ranked and combined: the fake backend's tests above; channels-last's effect on a model:
    test_compile's)."""
    pytest.importorskip("torch")
    from tests.test_corpus import CORPUS, CORPUS_SUITE, FAST

    shutil.copy(CORPUS / "gpt.py", tmp_path / "gpt.py")
    (tmp_path / "corpus.toml").write_text(CORPUS_SUITE)
    proc = run_cli(["advise", "corpus.toml", "--set", "workload=gpt:gpt", "--set", "precision=fp32", *FAST, "--only",
                    "precision", "--only", "optimizer", "--budget", "150", "--out", "runs", "--no-report"], cwd=tmp_path,
                   env=plain_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    rows = rows_by_name(advice_of(run_dir))
    assert set(rows) == {"precision amp-bf16", "optimizer fused", "optimizer foreach"}
    for r in rows.values():
        assert r["config_id"].startswith("gpt.gpt-torch-cpu") and min(r["repeats"]) >= 2 and r["speedup"] > 0
        assert r["verdict"] in ("improved", "unchanged", "inconclusive", "regressed")
        # the same model learning as the baseline does after the same steps (bf16's rounding included)
        assert r["loss_ratio"] == pytest.approx(1.0, abs=0.05), r
    assert "does not apply: precision amp-fp16: unsupported" in proc.stdout


def test_the_python_call_returns_the_ranked_table(tmp_path):
    """gpubench.api.advise, in a process of its own (the test backend registered there only, so
    that the other tests' registries stay as gpubench ships them)."""
    script = f"""
import json, sys
from pathlib import Path
import tests.plugins.fake  # registers fake-advise
from gpubench.api import advise
table = advise("fault", framework="fake-advise", batch_size=8, warmup_steps=1, steps=4, windows=2,
               only=["optimizer"], threshold="10%", budget_s=60, out=Path({str(tmp_path / "runs")!r}))
try:
    advise("fault", framework="fake-advise", batch_size=[8, 16])
    refused = ""
except Exception as e:
    refused = str(e)
print(json.dumps({{"practice": list(table["practice"]), "verdict": list(table["verdict"]),
                  "ci_low": list(table["ci_low"]), "best": table.attrs["best"]["practice"],
                  "lines": table.attrs["best_lines"], "run_dir": table.attrs["run_dir"], "refused": refused}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=plugin_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["practice"] == ["optimizer fused", "optimizer foreach"]
    assert got["verdict"] == ["improved", "unchanged"] and all(v > 0 for v in got["ci_low"])
    assert got["best"] == "optimizer fused" and got["lines"] == ['optimizer_impl = "fused"']
    assert Path(got["run_dir"]).is_dir() and "one value each" in got["refused"]


def test_a_baseline_that_shared_its_cores_is_said_to_have():
    from gpubench.advise.command import contention_line
    from gpubench.config import Config

    base_c = Config(framework="torch", workload="mlp", device="cpu")
    quiet = _results(base_c, [100, 101, 99])
    assert contention_line(quiet) == ""
    for r, others in zip(quiet, (1.6, 0.1, 1.2)):
        r.telemetry = {"host": {"cores": 2, "others_cores": others, "shared_cores": others > 1}}
    line = contention_line(quiet)
    assert line.startswith("a shared machine: 2 of the baseline's 3 rounds ran while other processes used up to 1.6 "
                           "cores") and "a threads practice" in line


def test_a_practice_that_resolves_to_another_is_measured_once_under_its_name():
    """``compile = "best"`` is torch-compile on a CPU: one practice, named for both, not the same
    config measured twice (which the results file would hold under one id twice); where it is the
    config's own mode, it is skipped saying so."""
    from gpubench.advise.practices import candidates
    from gpubench.config import Config

    practices, _ = candidates(Config("mlp"))
    compiled = [p for p in practices if p.sets == (("compile", "torch-compile"),)]
    assert [p.name for p in compiled] == ["compile torch-compile (= best)"]
    assert len({p.sets for p in practices}) == len(practices)
    practices, skipped = candidates(Config("mlp", compile="torch-compile"))
    assert not any(p.sets == (("compile", "torch-compile"),) for p in practices)
    assert ("compile best", "compile best is torch-compile for this config, its own") in [
        (s.name, s.reason) for s in skipped]
