"""How long ``gpubench bisect`` takes to name a commit on this machine: a scratch repository of a
user's PyTorch model (tests/scratch_repo.py) whose 11th of 16 commits adds about a tenth more
arithmetic to the training step, bisected from its first commit to its last.

    PYTHONPATH=. python benchmarks/bisect_scratch.py [--commits 16] [--culprit 11] [--repeats 6] [--alpha 0.05]
                                                     [--runs 1]

Prints the culprit named (and whether it is the right one), every step's verdict and the
wall time of the whole bisection (the ends, ceil(log2 (commits - 1)) steps and the culprit
against its parent); with ``--runs N``, N bisections one after the other, then how many named
the right commit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.scratch_repo import make_repo  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=16)
    ap.add_argument("--culprit", type=int, default=11)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--alpha", default="0.05")
    ap.add_argument("--budget", default="90")
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args(argv)
    outcomes = [bisect_once(a) for _ in range(a.runs)]
    if a.runs > 1:
        right = sum(o == "right" for o in outcomes)
        print(f"{a.runs} bisections: {right} named the right commit; " + ", ".join(outcomes))
    return 0 if all(o in ("right", "WRONG", "none") for o in outcomes) else 1


def bisect_once(a: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="gpubench-bisect-") as tmp:
        repo = Path(tmp) / "proj"
        shas = make_repo(repo, a.commits, a.culprit)
        cmd = [sys.executable, "-m", "gpubench", "bisect", "suite.toml", "--good", shas[0], "--bad", shas[-1],
               "--repeats", str(a.repeats), "--alpha", a.alpha, "--budget", a.budget, "--json", "out.json"]
        print("$ gpubench " + " ".join(cmd[3:]).replace(shas[0], "<first>").replace(shas[-1], "<last>"))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        took = time.perf_counter() - t0
        if proc.returncode not in (0, 1):
            print(proc.stdout[-2000:], proc.stderr[-2000:])
            return f"exit {proc.returncode}"
        out = json.loads((repo / "out.json").read_text())
    named = out.get("culprit")
    outcome = "none" if not named else "right" if named == shas[a.culprit - 1] else "WRONG"
    print(f"exit {proc.returncode}; culprit {named[:12] if named else None} (the injected one: "
          f"{shas[a.culprit - 1][:12]}, {outcome})")
    confirm = [out["confirm"]] if out.get("confirm") else []
    for label, s in ([("ends", e) for e in out["ends"]] + [(f"step {i}", s) for i, s in enumerate(out["steps"], 1)]
                     + [("confirm", c) for c in confirm]):
        ratio = f"x{s['ratio']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]" if s.get("ci_low") else "-"
        print(f"  {label}: {s['candidate'][:12]} vs {s['baseline'][:12]}: {s['verdict']} {ratio} "
              f"({s['seconds']:.0f} s)" + (", with the rounds before it" if s.get("pooled") else ""))
    if out.get("warning"):
        print(f"  warning: {out['warning']}")
    print(f"{a.commits} commits, {len(out['steps'])} steps after the ends"
          + (", then the culprit against its parent" if confirm else "") + f", {took:.0f} s in all", flush=True)
    return outcome


if __name__ == "__main__":
    raise SystemExit(main())
