"""Lockstep A/B: two workers taking turns window by window, and the paired gate on their rounds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpubench.launch import Interpreter, turn_pipes
from tests.conftest import REPO, run_cli
from tests.test_ab_and_plugin import SUITE, side_path

# a stand-in worker: the lockstep protocol around three "windows" of 50 ms each, the start and
# end of each written as a JSON line
WORKER = """
import json, sys, time
from gpubench.measure.turns import Turns
turns = Turns.from_env()
die_after_begin = sys.argv[2] == "die"
turns.begin()
if die_after_begin:
    sys.exit(0)
spans = []
for w in range(3):
    turns.swap()
    t0 = time.monotonic()
    time.sleep(0.05)
    spans.append((t0, time.monotonic()))
turns.end()
open(sys.argv[1], "w").write(json.dumps({"spans": spans, "lockstep": turns.describe()}))
"""


def start(tmp_path, name, ends, mode="run"):
    launcher = Interpreter(sys.executable, str(REPO), turns=ends)
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / f"{name}.json"), mode],
                            env=launcher.env(), pass_fds=launcher.pass_fds)
    ends.close()
    return proc


def test_two_workers_take_turns_window_by_window(tmp_path):
    first, second = turn_pipes()
    procs = [start(tmp_path, "a", first), start(tmp_path, "b", second)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    spans = sorted([(*s, "a") for s in a["spans"]] + [(*s, "b") for s in b["spans"]])
    assert [side for _, _, side in spans] == ["a", "b"] * 3  # the first begins, then they alternate
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))  # never two windows at once
    assert a["lockstep"]["role"] == "first" and b["lockstep"]["role"] == "second"
    assert a["lockstep"]["paired"] and b["lockstep"]["paired"]
    assert b["lockstep"]["waited_s"] >= 0.1  # it waited through the other's windows


def test_a_worker_whose_other_side_dies_goes_on_alone(tmp_path):
    first, second = turn_pipes()
    t0 = time.monotonic()
    procs = [start(tmp_path, "a", first), start(tmp_path, "b", second, mode="die")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert time.monotonic() - t0 < 30  # no wait for a token that never comes
    a = json.loads((tmp_path / "a.json").read_text())
    assert len(a["spans"]) == 3 and a["lockstep"]["paired"] is False


def test_no_lockstep_without_the_environment():
    from gpubench.measure.turns import Turns

    turns = Turns.from_env()
    turns.begin()
    turns.swap()
    turns.end()
    assert turns.describe() is None and Interpreter().pass_fds == () and "GPUBENCH_TURNS" not in Interpreter().env()


def ab_lockstep(tmp_path, write_suite, candidate_ms, *extra, candidate_checkout=None):
    suite = write_suite(SUITE)
    n = len(list(tmp_path.glob("a*")))
    candidate = side_path(tmp_path, f"b{n}", candidate_ms)
    if candidate_checkout is not None:  # its gpubench ahead of the repository's
        first, rest = candidate.split(os.pathsep, 1)
        candidate = os.pathsep.join([first, str(candidate_checkout), rest])
    return run_cli(["ab", str(suite), "--lockstep", "--baseline-python", sys.executable, "--baseline-path",
                    side_path(tmp_path, f"a{n}", 2.0), "--candidate-python", sys.executable, "--candidate-path",
                    candidate, "--out", str(tmp_path / "runs"), "--json",
                    str(tmp_path / "gate.json"), "--no-report", *extra], cwd=tmp_path, timeout=600)


@pytest.mark.slow
def test_ab_lockstep_pairs_the_rounds_and_gates(tmp_path, write_suite):
    # a gpubench in the working directory (as when ab runs inside a checkout) and another as the
    # candidate's checkout: each side's workers import their own, never the working directory's
    shutil.copytree(REPO / "gpubench", tmp_path / "gpubench")
    shutil.copytree(REPO / "gpubench", tmp_path / "cand" / "gpubench")
    # --budget: the first look (at alpha / 2) decides, so no more rounds run
    proc = ab_lockstep(tmp_path, write_suite, 4.0, "--repeats", "8", "--budget", "10m",
                       candidate_checkout=tmp_path / "cand")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    gate = json.loads((tmp_path / "gate.json").read_text())
    assert gate["paired"] is True and gate["counts"] == {"regressed": 1}
    assert len(gate["looks"]) == 1 and gate["alpha"] == 0.005
    assert "look 1: 8 rounds, alpha 0.005: every config decided" in proc.stdout
    (v,) = gate["verdicts"]
    assert v["n_baseline"] == v["n_current"] == 8 and 0.4 < v["ratio"] < 0.7
    assert "spread of the per-round ratio in this comparison" in proc.stdout and "with 8 rounds" in proc.stdout
    (root,) = (tmp_path / "runs").iterdir()
    sides = {s: [json.loads(x) for x in (root / s / "results.jsonl").read_text().splitlines()]
             for s in ("baseline", "candidate")}
    for r in sides["baseline"] + sides["candidate"]:
        assert r["runtime"]["lockstep"]["paired"] is True
    assert {r["runtime"]["gpubench"]["path"] for r in sides["baseline"]} == {str(REPO / "gpubench")}
    assert {r["runtime"]["gpubench"]["path"] for r in sides["candidate"]} == {str(tmp_path / "cand" / "gpubench")}
    roles = [r["runtime"]["lockstep"]["role"] for r in sides["baseline"]]
    assert roles == ["first", "second"] * 4  # who begins alternates by round
    # each progress line names the side that ran it, in the order the round began them
    config_id = sides["baseline"][0]["config_id"]
    assert f"[1/16] {config_id} (baseline): ok" in proc.stdout and f"[2/16] {config_id} (candidate): ok" in proc.stdout
    assert f"[3/16] {config_id} r1 (candidate): ok" in proc.stdout
    # the report of the two sides leads with the A/B's verdicts (its ab.json), the runs named by side
    assert json.loads((root / "ab.json").read_text()) == gate
    rep = run_cli(["report", str(root / "baseline"), str(root / "candidate"), "--out", "rep"], cwd=tmp_path)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    html = (tmp_path / "rep" / "index.html").read_text()
    assert f"<title>gpubench report: A/B {root.name}: candidate against baseline</title>" in html
    assert '<h2 id="ab">A/B verdict: REGRESSION: 1 regressed</h2>' in html and "<td>regressed</td>" in html
    assert "<th>candidate</th>" in html and "<th>change [CI]</th>" in html and "paired rounds" in html
    assert "look 1: 8 rounds at alpha 0.005, 0 undecided" in html
    assert "<th>baseline</th>" in html.split('id="summary"')[1]  # the runs side by side, named by side
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert f"### A/B {root.name}: REGRESSION: 1 regressed" in md and "| regressed |" in md
    (root / "ab.json").write_text("[1, 2]")  # damaged: the sides are still reported, with a warning
    rep = run_cli(["report", str(root / "baseline"), str(root / "candidate"), "--out", "rep2"], cwd=tmp_path)
    assert rep.returncode == 0 and "not an A/B's verdicts" in rep.stderr, rep.stderr
    assert "are not there" in (tmp_path / "rep2" / "index.html").read_text()
    # compare knows the two directories for the sides of one lockstep A/B, and pairs them too
    out = tmp_path / "again.json"
    again = run_cli(["compare", str(root / "baseline"), str(root / "candidate"), "--json", str(out)], cwd=tmp_path)
    assert again.returncode == 1 and json.loads(out.read_text())["paired"] is True
    # --best-of 2: each side's better of two consecutive rounds a pair, 8 rounds -> 4 pairs
    best = run_cli(["compare", str(root / "baseline"), str(root / "candidate"), "--best-of", "2", "--alpha", "0.1",
                    "--json", str(out)], cwd=tmp_path)
    found = json.loads(out.read_text())
    assert best.returncode == 1 and found["best_of"] == 2 and found["verdicts"][0]["n_baseline"] == 4, best.stdout
    assert "each side's best of 2 rounds a pair" in best.stdout and "--best-of 2" in best.stdout  # reproduce
    short = run_cli(["compare", str(root / "baseline"), str(root / "candidate"), "--best-of", "2"], cwd=tmp_path)
    assert short.returncode == 2 and "at alpha 0.01 best of 2 needs at least 14 repeats per side" in short.stderr


def test_ab_lockstep_bad_input(tmp_path, write_suite):
    proc = ab_lockstep(tmp_path, write_suite, 2.0, "--repeats", "6")
    assert proc.returncode == 2 and "--repeats 6: comparing 1 config(s) at alpha 0.01 needs at least 7 rounds" \
        in proc.stderr
    proc = ab_lockstep(tmp_path, write_suite, 2.0, "--repeats", "7", "--budget", "10m")
    assert proc.returncode == 2 and "alpha 0.005 (the first look of --budget) needs at least 8 rounds" in proc.stderr
    proc = ab_lockstep(tmp_path, write_suite, 2.0, "--repeats", "13", "--best-of", "2")
    assert proc.returncode == 2 and "alpha 0.01 needs at least 14 rounds" in proc.stderr
    proc = run_cli(["ab", str(write_suite(SUITE)), "--baseline-python", sys.executable, "--candidate-python",
                    sys.executable, "--best-of", "2", "--out", str(tmp_path / "runs")], cwd=tmp_path)
    assert proc.returncode == 2 and "--best-of 2: needs --lockstep" in proc.stderr
    proc = ab_lockstep(tmp_path, write_suite, 2.0, "--repeats", "7", "--set", "parallelism=ddp:2")
    assert proc.returncode == 2 and "--lockstep runs one process a side, not a distributed config" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("n, alpha, k", [(10, 0.01, 4), (6, 0.05, 1), (20, 0.05, 53), (5, 0.05, 0)])
def test_signed_rank_critical_values_match_the_tables(n, alpha, k):
    from gpubench.gate.stats import _walsh_k

    # k - 1 is the table's critical value of T for a two-sided test at alpha (n=5 has none at 0.05)
    assert _walsh_k(n, alpha) == k


@pytest.mark.slow
def test_ab_budget_looks_again_while_undecided_and_stops_at_the_budget(tmp_path, write_suite):
    """Threshold 0%: no config can be called unchanged, so an A/A comparison stays undecided
    and the sequential gate looks again (at alpha / 4 after alpha / 2) until the budget is
    spent."""
    t0 = time.monotonic()
    proc = ab_lockstep(tmp_path, write_suite, 2.0, "--repeats", "8", "--budget", "45s", "--threshold", "0%",
                       "--noise-floor", "0%")
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gate = json.loads((tmp_path / "gate.json").read_text())
    looks = gate["looks"]
    assert len(looks) >= 2 and looks[0]["rounds"] == 8 and looks[1]["rounds"] > 8
    assert [x["alpha"] for x in looks[:2]] == [0.005, 0.0025] and gate["alpha"] == looks[-1]["alpha"]
    assert "budget (45 s) is spent" in proc.stdout and wall < 45 + 60  # the last batch fits the budget's rest
    (v,) = gate["verdicts"]
    assert v["verdict"] == "inconclusive" and v["n_baseline"] == looks[-1]["rounds"]



@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "the file: expected a JSON object, not a list"),
    ('"x"', "the file: expected a JSON object, not a str"),
    ("null", "the file: expected a JSON object, not a NoneType"),
    ('{"baseline": "a", "candidate": "b", "looks": [{"alpha": NaN, "undecided": 1, "rounds": 8}]}',
     "looks[0].alpha: expected a number from 1e-300 to 0.5"),
    ('{"baseline": "a", "candidate": "b", "looks": [{"alpha": 0.005, "undecided": Infinity, "rounds": 8}]}',
     "looks[0].undecided: expected an integer from 0 to 1e+09"),
    ('{"baseline": "a", "candidate": "b", "looks": [{"alpha": 0.005, "undecided": -1, "rounds": 8}]}',
     "looks[0].undecided: expected an integer from 0 to 1e+09"),
    ('{"baseline": "a", "candidate": "b", "looks": [{"alpha": 1e400, "undecided": 1, "rounds": 8}]}',
     "looks[0].alpha: expected a number"),
    ('{"baseline": 3, "candidate": "b", "looks": []}', "baseline: expected the path of its run directory"),
])
def test_a_damaged_continue_file_is_one_line(tmp_path, write_suite, text, message):
    (tmp_path / "bad.json").write_text(text)
    proc = run_cli(["ab", str(write_suite(SUITE)), "--lockstep", "--baseline-python", sys.executable,
                    "--candidate-python", sys.executable, "--continue", str(tmp_path / "bad.json"), "--out",
                    str(tmp_path / "runs")], cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # three lockstep A/Bs of 8 rounds
def test_ab_continue_pools_the_rounds_and_counts_the_looks_on(tmp_path, write_suite):
    """An A/A that the first A/B could not decide (threshold 0%: nothing is unchanged) is
    continued twice: the new rounds are numbered after the earlier ones and pooled with all of
    them, each look is at half the alpha of the one before (alpha / 2, / 4, / 8 over the three
    A/Bs), and at a threshold of 3% the pooled rounds decide it."""
    suite = write_suite(SUITE)
    sides = ["--baseline-python", sys.executable, "--baseline-path", side_path(tmp_path, "a", 2.0),
             "--candidate-python", sys.executable, "--candidate-path", side_path(tmp_path, "b", 2.0)]

    def ab(out, *extra):
        return run_cli(["ab", str(suite), "--lockstep", *sides, "--repeats", "8", "--out", str(tmp_path / out),
                        "--json", str(tmp_path / f"{out}.json"), "--no-report", *extra], cwd=tmp_path, timeout=600)

    undecided = ["--budget", "1s", "--threshold", "0%", "--noise-floor", "0%"]
    # an A/A at a threshold of 0% stays undecided but for a false alarm: once in five CI runs on a
    # loaded 2-core machine the first look called it "improved", more often than its alpha says
    # (noted for the gate's own issue); what this test is about starts from an undecided A/B
    for _ in range(3):
        shutil.rmtree(tmp_path / "first", ignore_errors=True)
        first = ab("first", *undecided)
        assert first.returncode in (0, 1), first.stdout + first.stderr
        gate = json.loads((tmp_path / "first.json").read_text())
        if gate["verdicts"][0]["verdict"] == "inconclusive":
            break
    assert gate["verdicts"][0]["verdict"] == "inconclusive" and [x["alpha"] for x in gate["looks"]] == [0.005]
    assert first.returncode == 0
    mid = ab("mid", "--continue", str(tmp_path / "first.json"), *undecided)
    assert mid.returncode == 0 and "continuing 1 look(s) and 8 round(s)" in mid.stdout, mid.stdout + mid.stderr
    then = ab("then", "--continue", str(tmp_path / "mid.json"), "--threshold", "3%")
    assert then.returncode == 0, then.stdout + then.stderr
    assert "continuing 2 look(s) and 16 round(s)" in then.stdout and "next look at alpha 0.00125" in then.stdout
    pooled = json.loads((tmp_path / "then.json").read_text())
    assert [x["alpha"] for x in pooled["looks"]] == [0.005, 0.0025, 0.00125] and pooled["alpha"] == 0.00125
    (v,) = pooled["verdicts"]
    assert v["verdict"] == "unchanged" and v["n_baseline"] == v["n_current"] == 24
    between = json.loads((tmp_path / "mid.json").read_text())
    assert pooled["pooled_with"] == [gate["baseline"], gate["candidate"], between["baseline"], between["candidate"]]
    new = [json.loads(x) for x in (Path(pooled["candidate"]) / "results.jsonl").read_text().splitlines()]
    assert sorted(r["repeat"] for r in new) == list(range(16, 24))  # only its own rounds, numbered after the rest
    # bad input: one line, exit 2, nothing run
    other = ["--candidate-path", side_path(tmp_path, "c", 2.0)]
    for extra, message in [(["--continue", str(tmp_path / "nope.json")],
                            "nope.json: cannot be read (No such file or directory)"),
                           (["--continue", str(tmp_path / "first.json"), *other], "continue it with the same sides"),
                           (["--continue", str(tmp_path / "first.json"), "--set", "batch_size=4"],
                            "continue it with the same suite and --set"),
                           (["--continue", str(tmp_path / "first.json"), "--alpha", "0.05"],
                            "that A/B ran at alpha 0.01, not 0.05; give --alpha 0.01"),
                           (["--continue", str(tmp_path / "then.json")], "every config of that A/B was decided"),
                           # continued once (by mid): its next looks' alpha is spent
                           (["--continue", str(tmp_path / "first.json"), *undecided],
                            "that A/B was continued already")]:
        bad = ab("bad", *extra)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
    plain = run_cli(["ab", str(suite), *sides, "--continue", str(tmp_path / "first.json"), "--out",
                     str(tmp_path / "bad")], cwd=tmp_path)
    assert plain.returncode == 2 and "--continue" in plain.stderr and "needs --lockstep" in plain.stderr
    assert not (tmp_path / "bad").exists()
