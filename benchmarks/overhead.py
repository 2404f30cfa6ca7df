"""Harness overhead: the same training step as a bare hand-written loop and through gpubench.

What it measures: the throughput (samples/s) of gpubench's measurement path -- the backend's
trainer driven by ``gpubench.measure.loop.run_loop`` with its per-step timer -- relative to a
plain loop written out by hand doing the same work: the same model (written out in
``_bare_torch.py`` as an ``nn.Sequential``, or in ``_bare_tf.py`` as a channels-last Keras
``Sequential`` with a plain ``@tf.function`` step; not built by gpubench's translation),
initial weights, optimizer, precision settings and device-resident synthetic batches, timed
only as the total wall time of N steps (after a device synchronisation on a GPU).
``--framework`` picks PyTorch (default) or TensorFlow; only that framework is imported.

Why: gpubench reports the speed of a training step, so its own cost (timer marks, the
trainer's indirection, the loss kept per step) must be measured, not assumed.
Target: gpubench's throughput within 1% of the bare loop for steps of 1 ms or longer.

Method: both sides are warmed up, then run in rounds interleaved A B, B A, A B ... Each side
takes one untimed step before its N timed ones (as run_loop's cold-start step). A pair of
rounds (both orders) gives one ratio, the geometric mean of its two gpubench/bare ratios, so
an advantage of going first cancels. The verdict uses the median over pairs and its
distribution-free 95% CI (order statistics): PASS when the whole CI is >= 0.99, FAIL when it
is wholly below, INCONCLUSIVE otherwise (machine noise wider than 1%). ``--aa`` runs a second
bare loop in gpubench's place: the spread of that A/A ratio around 1 is this machine's noise
floor.

    PYTHONPATH=. python benchmarks/overhead.py [--framework tensorflow [--compile xla]] [--device cuda]
        [--aa] [--json out.json] [--strict]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # run from a plain checkout; the bare loops are beside

import numpy as np

from gpubench.backends import get_backend
from gpubench.measure.loop import run_loop
from gpubench.measure.stats import median_ci
from gpubench.results.store import write_text_atomic
from gpubench.runner.worker import metrics_from
from gpubench.suite import Config
from gpubench.workloads import get_workload
from gpubench.workloads.data import pool_batches, synthetic_batches

TARGET = 0.99  # gpubench throughput >= 99% of the bare loop's ...
MIN_STEP_MS = 1.0  # ... for steps of at least this long
SEED = 0
# defaults per device kind: (batch size, mlp depth, mlp width), each giving steps of >= 1 ms
DEFAULTS = {"cpu": (128, 2, 512), "cuda": (512, 4, 4096)}
# the bare loop per framework (a module beside this one, imported only when chosen):
# BareLoop(args, spec, weights, batches) with .run(n) -> seconds and .loss, and describe(args)
BARE = {"torch": "_bare_torch", "tensorflow": "_bare_tf"}
# --telemetry: untimed steps at the start of each round on both sides, so that starting the
# samplers falls outside the timed window, as it does in a run (sampling starts before warm-up)
TELEMETRY_WARMUP = 5


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--framework", default="torch", choices=sorted(BARE), help="default torch")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--workload", default="mlp", choices=["mlp", "cnn"])
    p.add_argument("--batch-size", type=int, help="default 128 on cpu, 512 on cuda")
    p.add_argument("--depth", type=int, help="mlp hidden layers (default 2 on cpu, 4 on cuda)")
    p.add_argument("--width", type=int, help="mlp hidden units (default 512 on cpu, 4096 on cuda)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "amp-fp16", "amp-bf16"])
    p.add_argument("--compile", default="none", choices=["none", "xla"],
                   help="xla: TensorFlow's jit_compile on both sides (default none)")
    p.add_argument("--steps", type=int, help="timed steps per side per round (default 20; 100 with --telemetry)")
    p.add_argument("--rounds", type=int, help="interleaved rounds, even (default 80; 40 with --telemetry)")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps per side first (default 30)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--aa", action="store_true", help="A/A test: a second bare loop in gpubench's place")
    mode.add_argument("--telemetry", action="store_true",
                      help="telemetry overhead: gpubench with sampling on vs off")
    p.add_argument("--interval-ms", type=int, default=100, help="sampling interval with --telemetry (default 100)")
    p.add_argument("--json", type=Path, help="write the figures to this file")
    p.add_argument("--strict", action="store_true", help="exit 1 on FAIL")
    a = p.parse_args(argv)
    a.steps = a.steps if a.steps is not None else 100 if a.telemetry else 20
    a.rounds = a.rounds if a.rounds is not None else 40 if a.telemetry else 80
    batch, depth, width = DEFAULTS["cuda" if a.device.startswith("cuda") else "cpu"]
    a.batch_size, a.depth, a.width = (batch if a.batch_size is None else a.batch_size,
                                      depth if a.depth is None else a.depth, width if a.width is None else a.width)
    if min(a.steps, a.batch_size, a.depth, a.width, a.interval_ms) < 1 or a.warmup < 0:
        p.error("--steps, --batch-size, --depth, --width and --interval-ms must be >= 1, --warmup >= 0")
    if a.rounds < 2 or a.rounds % 2:
        p.error("--rounds must be even and >= 2 (each pair of rounds runs both orders)")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = (("depth", args.depth), ("width", args.width)) if args.workload == "mlp" else ()
    config = Config(workload=args.workload, framework=args.framework, device=args.device,
                    batch_size=args.batch_size, precision=args.precision, optimizer="adam", lr=1e-3,
                    compile=args.compile, seed=SEED, workload_params=params)
    backend = get_backend(args.framework)
    try:
        verdict = backend.check(config)
    except ImportError as e:
        verdict = ("unavailable", f"{args.framework} is not installed ({e})")
    if verdict is not None:
        print(f"cannot run {config.config_id}: {verdict[0]}: {verdict[1]}", file=sys.stderr)
        return 2
    spec = get_workload(args.workload).spec(**dict(params))
    batches = synthetic_batches(spec, args.batch_size, pool_batches(spec, args.batch_size), SEED)
    trainer = backend.build(spec, config, batches)  # sets cudnn/TF32 flags before the bare side
    bare_loops = importlib.import_module(BARE[args.framework])
    bare = None if args.telemetry else bare_loops.BareLoop(args, spec, spec.init_weights(SEED), batches)
    other = bare_loops.BareLoop(args, spec, spec.init_weights(SEED), batches) if args.aa else None
    base_name, name = ("off", "on") if args.telemetry else ("bare", "bare-2" if args.aa else "gpubench")
    samples = args.batch_size * args.steps
    last_loss = {"bare": float("nan")}

    def run_bare() -> dict[str, float]:
        if bare is not None:
            return {"bare_sps": samples / bare.run(args.steps)}
        raw = run_loop(trainer, warmup_steps=TELEMETRY_WARMUP, steps=args.steps, windows=1)  # telemetry off
        last_loss["bare"] = raw.loss_last
        return {"bare_sps": samples * 1000.0 / sum(raw.window_wall_ms)}

    def run_telemetry_on() -> dict[str, float]:
        from gpubench.telemetry.session import TelemetrySession
        session = TelemetrySession(args.device, args.interval_ms, backend.device_uuids(config),
                                   ordinals=config.local_cuda_ordinals).start()
        raw = run_loop(trainer, warmup_steps=TELEMETRY_WARMUP, steps=args.steps, windows=1, observer=session)
        block, timeline = session.stop(raw.phases, samples)
        if block["errors"]:
            raise SystemExit(f"telemetry errors: {block['errors']}")
        m = metrics_from(raw, config, 0.0)
        return {"gpubench_sps": samples * 1000.0 / sum(raw.window_wall_ms), "gpubench_median_sps":
                m["throughput"]["median"], "gpubench_loss": m["loss"]["last"],
                "host_samples": len(timeline["host"]), "gpu_samples": len(timeline["gpu"])}

    def run_gpubench() -> dict[str, float]:
        if other is not None:
            sps = samples / other.run(args.steps)
            return {"gpubench_sps": sps, "gpubench_median_sps": sps, "gpubench_loss": other.loss}
        raw = run_loop(trainer, warmup_steps=0, steps=args.steps, windows=1)
        m = metrics_from(raw, config, 0.0)  # what gpubench's result would say
        return {"gpubench_sps": samples * 1000.0 / sum(raw.window_wall_ms),
                "gpubench_median_sps": m["throughput"]["median"], "gpubench_loss": m["loss"]["last"]}

    if bare is not None:
        bare.run(args.warmup + 1)  # each side: 1 + warmup + 1 steps, as run_loop does
    if other is not None:
        other.run(args.warmup + 1)
    else:
        run_loop(trainer, warmup_steps=args.warmup, steps=1, windows=1)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order: list[tuple[str, Callable[[], dict[str, float]]]] = [
            (base_name, run_bare), (name, run_telemetry_on if args.telemetry else run_gpubench)]
        row: dict[str, Any] = {"round": r, "first": order[r % 2][0]}
        for _, fn in order[::-1] if r % 2 else order:
            row.update(fn())
        row["bare_loss"] = bare.loss if bare is not None else last_loss["bare"]
        row["ratio"] = row["gpubench_sps"] / row["bare_sps"]
        rounds.append(row)

    def med(key: str) -> float:
        return float(np.median([r[key] for r in rounds]))

    pairs = np.sqrt([a["ratio"] * b["ratio"] for a, b in zip(rounds[::2], rounds[1::2])])
    ratio = float(np.median(pairs))
    lo, hi = median_ci(pairs)
    step_ms = args.batch_size * 1000.0 / med("bare_sps")
    extra_us = 1000.0 * step_ms * (1 / ratio - 1)  # the ratio as time added to each step
    if step_ms < MIN_STEP_MS:
        result = "n/a"  # the target is only claimed for steps of 1 ms or longer
    else:  # a verdict only where the 95% CI lies wholly on one side of the target
        result = "PASS" if lo >= TARGET else "FAIL" if hi < TARGET else "INCONCLUSIVE"
    dev_name, framework_text, framework_fields = bare_loops.describe(args)

    title = ("telemetry overhead (sampling off vs on, every "
             f"{args.interval_ms} ms)" if args.telemetry else "harness overhead")
    print(f"{title}{' (A/A test: bare vs bare-2)' if args.aa else ''}: {config.config_id}")
    print(f"device {args.device} ({dev_name}), {framework_text}; "
          f"{args.rounds} rounds x {args.steps} steps per side, {args.warmup} warm-up steps")
    print(f"{'round':>5} {'first':>8} {base_name + '/s':>10} {name + '/s':>11} {'ratio':>7} {'pair':>7} "
          f"{'median-step/s':>13}")
    for r, row in enumerate(rounds):
        pair = f"{pairs[r // 2]:.4f}" if r % 2 else ""
        print(f"{r:>5} {row['first']:>8} {row['bare_sps']:>10.1f} {row['gpubench_sps']:>11.1f} "
              f"{row['ratio']:>7.4f} {pair:>7} {row['gpubench_median_sps']:>13.1f}")
    print(f"{base_name} step time {step_ms:.3f} ms (median over rounds); final loss {base_name} "
          f"{rounds[-1]['bare_loss']:.4g}, {name} {rounds[-1]['gpubench_loss']:.4g}")
    if args.telemetry:
        print(f"samples per 'on' round (median): host {med('host_samples'):.0f}, gpu {med('gpu_samples'):.0f}")
    own = "" if args.aa else f" (gpubench's own median-step figure {med('gpubench_median_sps'):.1f}/s)"
    print(f"throughput (median over rounds): {base_name} {med('bare_sps'):.1f}/s, "
          f"{name} {med('gpubench_sps'):.1f}/s{own}")
    print(f"ratio {name}/{base_name}: {ratio:.4f}, 95% CI [{lo:.4f}, {hi:.4f}] over {len(pairs)} pairs of rounds "
          f"(overhead {100 * (1 - ratio):+.2f}%, {extra_us:+.1f} us/step)")
    note = f" (the target applies to steps >= {MIN_STEP_MS:g} ms)" if result == "n/a" else ""
    print(f"target ratio >= {TARGET}: {result}{note}")

    if args.json:
        doc = {"config_id": config.config_id, "framework": args.framework, "aa_test": args.aa,
               "mode": "telemetry" if args.telemetry else "aa" if args.aa else "harness",
               "interval_ms": args.interval_ms if args.telemetry else None,
               "device": args.device, "device_name": dev_name, **framework_fields,
               "workload": args.workload, "workload_params": dict(params), "batch_size": args.batch_size,
               "precision": args.precision, "compile": args.compile, "steps": args.steps, "n_rounds": args.rounds, "warmup": args.warmup,
               "bare_step_ms": step_ms, "bare_sps": med("bare_sps"), "gpubench_sps": med("gpubench_sps"),
               "gpubench_median_sps": med("gpubench_median_sps"), "extra_us_per_step": extra_us,
               "ratio": ratio, "ratio_ci": [lo, hi], "pair_ratios": pairs.tolist(), "target": TARGET,
               "min_step_ms": MIN_STEP_MS, "result": result, "rounds": rounds}
        write_text_atomic(args.json, json.dumps(doc, indent=2) + "\n")
    return 1 if args.strict and result == "FAIL" else 0


if __name__ == "__main__":
    sys.exit(main())
