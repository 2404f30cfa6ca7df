"""gpubench bisect: the search with scripted verdicts (log2 steps, an inconclusive step measured
again, then the range named), bad input, and on a scratch repository of a user's model whose
third commit makes the training step slower (slow: real A/Bs)."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from gpubench.bisect.search import Bisection, Step
from tests.conftest import plain_env, run_cli
from tests.scratch_repo import make_repo


def run_search(commits: list[str], culprit: str | None, flaky: set[str] = frozenset(), always: set[str] = frozenset()
               ) -> Bisection:
    """A bisection whose A/Bs say regressed exactly for the commits at or after ``culprit``;
    a commit in ``flaky`` is inconclusive once, one in ``always`` every time."""
    b = Bisection("good", commits)
    seen: set[str] = set()
    while (pair := b.next_pair()) is not None:
        base, cand, attempt = pair
        if cand in always or (cand in flaky and cand not in seen):
            seen.add(cand)
            verdict = "inconclusive"
        else:
            verdict = "regressed" if culprit is not None and commits.index(cand) >= commits.index(culprit) \
                else "unchanged"
        b.record(Step(base, cand, verdict, attempt))
    return b


@pytest.mark.parametrize("n", [1, 2, 3, 7, 15, 16, 33])
def test_every_culprit_is_found_in_log2_steps(n):
    commits = [f"c{i}" for i in range(n)]
    for k, culprit in enumerate(commits):
        b = run_search(commits, culprit)
        assert b.culprit == culprit, (n, k)
        assert len(b.steps) <= math.ceil(math.log2(n)) if n > 1 else len(b.steps) == 0
        # every step measured the midpoint against the last commit known good
        assert all(s.baseline == "good" or s.baseline in commits for s in b.steps)


def test_an_inconclusive_step_is_measured_again_then_the_range_is_named():
    commits = [f"c{i}" for i in range(16)]
    again = run_search(commits, "c10", flaky={"c7"})
    assert again.culprit == "c10"
    assert [(s.candidate, s.attempt, s.verdict) for s in again.steps[:2]] == [("c7", 0, "inconclusive"),
                                                                             ("c7", 1, "unchanged")]
    stuck = run_search(commits, "c10", always={"c11"})
    assert stuck.culprit is None and "stayed inconclusive after 2 measurements" in stuck.stopped
    assert "c10" in stuck.range and stuck.range == commits[commits.index(stuck.range[0]):
                                                           commits.index(stuck.range[-1]) + 1]


def test_a_step_out_of_order_is_refused():
    b = Bisection("good", ["a", "b", "c"])
    with pytest.raises(ValueError, match="not the one to measure next"):
        b.record(Step("good", "c", "regressed"))


@pytest.fixture
def scratch(tmp_path):
    repo = tmp_path / "proj"
    return repo, make_repo(repo, commits=4, culprit=3)


@pytest.mark.parametrize("args,message", [
    (["--good", "nope", "--bad", "HEAD"], "--good nope: not a commit of"),
    (["--good", "HEAD", "--bad", "HEAD~2"], "is not an ancestor of --bad"),
    (["--good", "HEAD", "--bad", "HEAD"], "are the same commit"),
    (["--good", "HEAD~1", "--bad", "HEAD", "--set", "precision=fp64"], "precision"),
])
def test_bad_input_is_one_line_and_exit_2(scratch, args, message):
    repo, _ = scratch
    proc = run_cli(["bisect", "suite.toml", *args, "--out", "out"], cwd=repo, env=plain_env())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and proc.stderr.strip().count("\n") == 0
    assert not (repo / "out").exists()


def test_not_a_git_repository_exits_2(tmp_path):
    (tmp_path / "s.toml").write_text("name = 's'\n[defaults]\nworkload = 'mlp'\n")
    proc = run_cli(["bisect", "s.toml", "--good", "a", "--bad", "b"], cwd=tmp_path, env=plain_env())
    assert proc.returncode == 2 and "not a git repository" in proc.stderr


@pytest.mark.slow
def test_bisect_names_the_commit_that_slowed_the_users_model(tmp_path):
    """Four commits, the third twice as slow (every A/B decided at its first look): the ends, two
    midpoints (the culprit found against the good commit, two back), then the culprit against its
    parent (the confirming A/B)."""
    pytest.importorskip("torch")
    repo = tmp_path / "proj"
    shas = make_repo(repo, commits=4, culprit=3, cols=4096)
    proc = run_cli(["bisect", "suite.toml", "--good", shas[0], "--bad", shas[-1], "--repeats", "6", "--alpha", "0.05",
                    "--budget", "60", "--json", "bisect.json", "--markdown", "bisect.md"], cwd=repo, env=plain_env(),
                   timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads((repo / "bisect.json").read_text())
    assert out["named"] and out["culprit"] == shas[2]
    info = out["culprit_info"]
    assert info["subject"] == "mynet: keep the batch's product with a padding buffer"
    assert info["author"] == "Scratch Author <author@example.com>" and "mynet.py" in info["diffstat"]
    # the 3 commits after the good one: ceil(log2 3) midpoints (a step measured again is one midpoint)
    assert len({(s["baseline"], s["candidate"]) for s in out["steps"]}) == math.ceil(math.log2(3))
    assert out["slowdown"]["verdict"] == "regressed" and out["slowdown"]["ratio"] < 0.97
    # the slowdown named is the culprit's own, against its parent: a confirming A/B, since the
    # step that found it was against an older commit
    assert out["slowdown"]["baseline"] == shas[1] and out["parent"] == shas[1] and "warning" not in out
    assert out["confirm"]["baseline"] == shas[1] and out["confirm"]["candidate"] == shas[2]
    md = (repo / "bisect.md").read_text()
    assert f"**Culprit: {shas[2][:12]}**" in md and f"| confirm | {shas[2][:12]} | {shas[1][:12]} | regressed |" in md
    # the worktrees are cached: a second bisection of part of the range makes none again
    trees = sorted(p.name for p in (repo / ".gpubench" / "worktrees").iterdir())
    assert len(trees) == len({s["candidate"] for s in out["steps"]} | {shas[0], shas[-1]})
    listed = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout
    assert listed.count("\n") == len(trees) + 1


@pytest.mark.slow
def test_an_inconclusive_measurement_is_continued_and_a_slowdown_that_does_not_reproduce_is_said(tmp_path):
    """Threshold 0%: an A/A cannot be called unchanged, so the ends stay inconclusive; measured
    again, their A/B is continued: the second verdict pools the first's rounds, its looks
    counted on (so the two together spend alpha once). Then the search stops there, exit 1: the
    slowdown did not reproduce at the ends, so nothing is bisected."""
    pytest.importorskip("torch")
    repo = tmp_path / "proj"
    shas = make_repo(repo, commits=2, culprit=None)
    proc = run_cli(["bisect", "suite.toml", "--good", shas[0], "--bad", shas[-1], "--repeats", "6", "--alpha", "0.05",
                    "--budget", "15", "--threshold", "0%", "--noise-floor", "0%", "--json", "bisect.json",
                    "--markdown", "bisect.md"], cwd=repo, env=plain_env(), timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads((repo / "bisect.json").read_text())
    first, second = out["ends"]
    assert first["verdict"] == second["verdict"] == "inconclusive"
    assert not out["named"] and "did not reproduce at the ends" in out["why_not"] and out["steps"] == []
    assert "No commit named: the slowdown did not reproduce at the ends" in proc.stdout
    assert second["attempt"] == 1 and second["pooled"] == first["ab_dir"] and not first["pooled"]
    a, b = (json.loads((repo / s["ab_dir"] / "ab.json").read_text()) for s in (first, second))
    assert b["looks"][:len(a["looks"])] == a["looks"] and len(b["looks"]) > len(a["looks"])
    assert b["alpha"] < a["alpha"] and b["pooled_with"] == [a["baseline"], a["candidate"]]
    assert b["verdicts"][0]["n_baseline"] > a["verdicts"][0]["n_baseline"]
    assert "inconclusive (with the rounds before it)" in (repo / "bisect.md").read_text()


def test_the_end_names_the_slowdown_against_the_parent_and_warns_where_it_did_not_confirm():
    """The markdown of a named culprit: the slowdown against its parent; where the confirming
    A/B did not find the culprit slower than its parent, a warning says the slowdown may be
    spread over the range, and the confirming step is in the table."""
    from gpubench.bisect.command import markdown
    from gpubench.bisect.search import Step

    found = Step("a" * 40, "c" * 40, "regressed", 0, 0.9, 0.85, 0.95, "steps/2")
    confirm = Step("b" * 40, "c" * 40, "unchanged", 0, 0.99, 0.96, 1.02, "steps/confirm")
    out = {"good": "g" * 40, "bad": "d" * 40, "named": True, "parent": "b" * 40,
           "culprit_info": {"commit": "c" * 40, "subject": "s", "author": "x", "date": "d", "diffstat": "1 file"},
           "slowdown": confirm.to_dict(), "confirm": confirm.to_dict(), "ends": [], "steps": [found.to_dict()],
           "commits": ["b" * 40, "c" * 40], "seconds": 10,
           "warning": "against its parent bbbbbbbbbbbb the culprit measured unchanged: the slowdown may be spread"}
    md = markdown(out)
    assert "- slowdown: throughput -1.0% [" in md and "against bbbbbbbbbbbb (its parent)" in md
    assert "- **warning**: against its parent bbbbbbbbbbbb the culprit measured unchanged" in md
    assert "| confirm | cccccccccccc | bbbbbbbbbbbb | unchanged |" in md
    del out["warning"], out["confirm"]
    out["slowdown"] = found.to_dict()
    md = markdown(out)
    assert "against aaaaaaaaaaaa (A/B" in md and "warning" not in md and "| confirm |" not in md


def test_resume_reuses_both_confirming_measurements():
    """A bisection stopped after its two confirming A/Bs (the first inconclusive) and resumed:
    both are read back from the state, so neither is measured again (a session with nothing to
    measure with would fail if it tried)."""
    from gpubench.bisect.command import _Session
    from gpubench.bisect.search import Step

    first = Step("p" * 40, "c" * 40, "inconclusive", 0, 0.95, 0.88, 1.02)
    second = Step("p" * 40, "c" * 40, "regressed", 1, 0.9, 0.85, 0.95)
    session = _Session.__new__(_Session)
    session.done_steps, session.confirm = [], []
    session.stored_confirm = [Step(**first.to_dict()), Step(**second.to_dict())]
    assert session.measure("p" * 40, "c" * 40, 0, "confirm") == first
    assert session.measure("p" * 40, "c" * 40, 1, "confirm") == second
