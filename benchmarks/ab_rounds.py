"""The rounds of a kept lockstep A/B, one line each: where its noise comes from.

    PYTHONPATH=. python benchmarks/ab_rounds.py RUNS/<suite>-ab-<time> [--config ID]

For each round of one config (the two run directories ``baseline`` and ``candidate`` of a
``gpubench ab --lockstep``, e.g. kept by ``benchmarks/ab_power.py --keep DIR``): each side's
median window time, the spread of its own windows (CV), and the round's throughput ratio
candidate/baseline. Then the same split the gate cannot make: the spread between a process's
windows (within) against the spread of the per-round ratio (between). A round whose ratio lies
more than ``--outlier`` (default 10%) from the median ratio is marked with the side that was
slow in every window of it, a process that was slower for its whole life, which pairing the
rounds cannot cancel.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


def load(side: Path, config: str | None) -> dict[int, dict]:
    rows = {}
    for line in (side / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("status") == "ok" and (config is None or r["config_id"] == config):
            rows[r["repeat"]] = r
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path, help="the A/B's directory, holding baseline/ and candidate/")
    ap.add_argument("--config", help="the config id (default: the only one)")
    ap.add_argument("--outlier", type=float, default=0.10, help="a round this far from the median ratio is marked")
    a = ap.parse_args(argv)
    base, cand = load(a.root / "baseline", a.config), load(a.root / "candidate", a.config)
    configs = {r["config_id"] for r in [*base.values(), *cand.values()]}
    if len(configs) != 1:
        raise SystemExit(f"{a.root}: {len(configs)} configs ({', '.join(sorted(configs)) or 'none ok'}); give --config")
    rounds = sorted(base.keys() & cand.keys())
    if len(rounds) < 3:
        raise SystemExit(f"{a.root}: {len(rounds)} complete round(s); need 3")

    def windows(r: dict) -> list[float]:
        return [w / n for w, n in zip(r["metrics"]["window_wall_ms"], r["metrics"]["window_steps"])]

    def cv(x: list[float]) -> float:
        return 100 * statistics.stdev(x) / statistics.mean(x) if len(x) > 1 else math.nan

    ratios = [cand[i]["metrics"]["throughput"]["median"] / base[i]["metrics"]["throughput"]["median"] for i in rounds]
    middle = statistics.median(ratios)
    print(f"{next(iter(configs))}: {len(rounds)} rounds; ms a step: median window, CV of the windows")
    print(f"{'round':>5} {'baseline':>16} {'candidate':>16} {'ratio':>7}  slow side")
    marked: list[tuple[str, bool]] = []
    for i, ratio in zip(rounds, ratios):
        wb, wc = windows(base[i]), windows(cand[i])
        off = ratio / middle - 1
        side = ""
        if abs(off) > a.outlier:
            slow, other = (wc, wb) if off < 0 else (wb, wc)
            whole = min(slow) > max(other)  # every window of the slow side slower than every one of the other
            side = f"{'candidate' if off < 0 else 'baseline'}{' (every window)' if whole else ''}"
            marked.append((side.split()[0], whole))
        print(f"{i:>5} {statistics.median(wb):>8.2f} {cv(wb):>6.1f}% {statistics.median(wc):>8.2f} {cv(wc):>6.1f}% "
              f"{ratio:>7.3f}  {side}")
    within = statistics.mean(cv(windows(r)) for r in [*base.values(), *cand.values()])
    logs = [math.log(r) for r in ratios]
    spread = 100 * (math.exp(statistics.stdev(logs)) - 1)  # as the gate's power line states it
    print(f"median ratio {middle:.3f}; spread of the per-round ratio {spread:.1f}%; mean CV of a process's own "
          f"windows {within:.1f}%")
    sides = {s: sum(m == s for m, _ in marked) for s in ("baseline", "candidate")}
    print(f"rounds more than {100 * a.outlier:g}% from the median ratio: {len(marked)} of {len(rounds)} (slow side: "
          f"baseline {sides['baseline']}, candidate {sides['candidate']}), {sum(w for _, w in marked)} with the slow "
          "side slower in every window")
    return 0


if __name__ == "__main__":
    sys.exit(main())
