"""A real history with a real slowdown, and what ``gpubench history check`` finds in it.

    PYTHONPATH=. python benchmarks/history_real.py [--commits 16] [--step-at 8] [--repeats 3]
                                                   [--extra-passes 60] [--db FILE] [--keep DIR]

Builds a throw-away git repository from this checkout's committed tree and records
``--commits`` commits of it into a fresh SQLite history, each with a real ``gpubench run``
(PyTorch MLP, batch 256, fp32, on the CPU, ``--repeats`` processes). From commit
``--step-at`` on, the repository's PyTorch trainer does real extra work after every optimizer
step (``--extra-passes`` in-place passes over the parameters, values unchanged), so training is
really slower from that commit: a code regression, not simulated numbers. Then it runs
``gpubench history check`` on that history and prints its table, the step the runs measured
(the median throughput after the step over the median before), and whether the check found the
step at the commit where it was made.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _slowdown import export_head, inject  # noqa: E402 - beside this file

RUN_SETS = ["framework=torch", "workload=mlp", "device=cpu", "precision=fp32", "batch_size=256", "warmup_steps=5",
            "steps=20", "windows=5"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def make_repo(root: Path) -> Path:
    """This checkout's committed tree (HEAD) as a fresh repository with one commit."""
    repo = export_head(root / "repo")
    git(repo, "init", "-q")
    git(repo, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "add", "-A")
    return repo


def commit(repo: Path, message: str, when: int) -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": f"@{when} +0000", "GIT_COMMITTER_DATE": f"@{when} +0000"}
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit",
                    "-q", "--allow-empty", "-am" if message != "first" else "-m", message], check=True, env=env)
    return git(repo, "rev-parse", "HEAD")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=16)
    ap.add_argument("--step-at", type=int, default=8, help="the first slower commit (0-based; default 8)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--extra-passes", type=int, default=60,
                    help="the injected work per optimizer step (default 60: about 30%% slower on the 2-vCPU VM)")
    ap.add_argument("--db", type=Path, help="the history file (default: in the temporary directory)")
    ap.add_argument("--keep", type=Path, help="build in this directory and keep it (default: a temporary one)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpubench-history-real-") as tmp:
        root = a.keep or Path(tmp)
        repo = make_repo(root)
        db = a.db or root / "history.db"
        env = {**os.environ, "PYTHONPATH": str(repo)}
        t0, start = time.perf_counter(), 1_790_000_000
        commits = []
        for i in range(a.commits):
            if i == a.step_at:
                inject(repo, a.extra_passes, "history_real.py")
            commits.append(commit(repo, "first" if i == 0 else f"commit {i}" + (" (slower)" if i == a.step_at
                                                                                 else ""), start + 3600 * i))
            cmd = [sys.executable, "-m", "gpubench", "run", "suites/quick.toml", "--repeats", str(a.repeats),
                   "--out", str(root / "runs"), "--no-report", "--no-calibrate", "--db", str(db)]
            for s in RUN_SETS:
                cmd += ["--set", s]
            proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stdout + proc.stderr, file=sys.stderr)
                return 1
            print(f"commit {i:2d} {commits[-1][:8]}{' (slower from here)' if i == a.step_at else ''}: recorded "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
        check = subprocess.run([sys.executable, "-m", "gpubench", "history", "check", "--db", str(db), "--json",
                                str(root / "check.json")], cwd=repo, env={**env, "COLUMNS": "200"},
                               capture_output=True, text=True)
        print(check.stdout + check.stderr)
        steps = json.loads((root / "check.json").read_text())["steps"]
        rows = subprocess.run([sys.executable, "-m", "gpubench", "history", "export", "--db", str(db), "--out",
                               str(root / "history.csv")], cwd=repo, env=env, capture_output=True, text=True)
        if rows.returncode != 0:
            print(rows.stderr, file=sys.stderr)
            return 1
        import pandas as pd

        frame = pd.read_csv(root / "history.csv")
        per_commit = frame[frame["status"] == "ok"].groupby("commit")["throughput"].median()
        before = statistics.median(per_commit[c] for c in commits[:a.step_at])
        after = statistics.median(per_commit[c] for c in commits[a.step_at:])
        print(f"measured: median throughput {before:.1f}/s before commit {a.step_at}, {after:.1f}/s from it "
              f"({100 * (after / before - 1):+.1f}%)")
        hit = [s for s in steps if s["commit"] == commits[a.step_at]]
        print(f"the check {'found' if hit else 'did not find'} the step at the commit that made it "
              f"({commits[a.step_at][:8]}); exit code {check.returncode}; {time.perf_counter() - t0:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
