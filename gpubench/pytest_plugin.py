"""pytest plugin (entry point ``pytest11``): gpubench training steps under pytest-benchmark.

    def test_mlp_step(gpubench_benchmark):
        step = gpubench_benchmark(workload="mlp", batch_size=128, device="cpu", steps_per_round=10)
        assert step.throughput > 0

Each pytest-benchmark round runs ``steps_per_round`` training steps of a gpubench trainer and
then synchronises the device, so the round's time is the device's time (asynchronous GPU work
is never under-counted). The trainer is built once, warmed up, and reused; extra_info records
the config id, samples per round and the median throughput. ``pytest --benchmark-autosave``
and ``--benchmark-compare-fail=median:5%`` then work on training steps. A config that cannot
run here (no such device, framework not installed, unsupported combination) is skipped with
its reason.

The fixture ``gpubench_ab`` is gpubench's own gate inside a test: it runs ``gpubench ab``
between a baseline checkout (``--gpubench-baseline-path`` or ``baseline_path=``) and this one,
every round in fresh processes, by default in lockstep with sequential looks within a time
budget, and fails the test with the verdict table when a config regressed:

    def test_mlp_is_not_slower(gpubench_ab):
        gpubench_ab(workload="mlp", batch_size=256, device="cpu", threads=1, budget="9m")
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpubench.gate import ALPHA, NOISE_FLOOR, THRESHOLD


class TrainingRound:
    """``steps_per_round`` training steps followed by a device synchronisation."""

    def __init__(self, config: Any, steps_per_round: int) -> None:
        from gpubench.backends import get_backend
        from gpubench.runner.models import zoo_unavailable

        missing = zoo_unavailable(config)
        if missing:
            pytest.skip(f"{config.config_id}: unavailable: {missing}")
        backend = get_backend(config.framework)
        backend.share_process()
        try:
            verdict = backend.check(config)
        except ImportError as e:
            pytest.skip(f"{config.framework} is not installed ({e})")
        if verdict is not None:
            pytest.skip(f"{config.config_id}: {verdict[0]}: {verdict[1]}")
        reason = backend.set_threads(config.threads) if config.threads else None
        if reason:
            pytest.skip(f"{config.config_id}: unsupported: {reason}")
        native = backend.native(config)  # the user's factory or a zoo's model: built here, in pytest's process
        self.model = native.facts  # params, flops_per_sample (or why none), source
        self.config = config
        from gpubench.runner.worker import build_trainer

        # the worker's pool: a global batch per step for dp:N / mirrored:N, the micro-batches of
        # grad-accum:N (so that samples_per_round counts what the trainer really takes)
        self.trainer, _ = build_trainer(backend, native, config, 0, 1, profiling=False)
        self.steps_per_round = steps_per_round
        self.samples_per_round = config.samples_per_step * steps_per_round
        self.throughput: float | None = None

    def __call__(self) -> None:
        step = self.trainer.step
        for _ in range(self.steps_per_round):
            step()
        self.trainer.sync()

    def loss(self) -> float:
        return self.trainer.read_loss()


@pytest.fixture
def gpubench_benchmark(benchmark: Any) -> Callable[..., TrainingRound]:
    """Benchmark a gpubench config: ``gpubench_benchmark(steps_per_round=10, rounds=10,
    warmup_rounds=2, **config_settings)``; the settings are a suite's keys (workload,
    framework, device, batch_size, precision, ...; a built-in workload's parameters such as
    depth; for your own model ``workload="mymodels:small_convnet"``, ``input_shape=(3, 32, 32)``
    and its keyword arguments as ``args={"width": 16}``)."""
    from gpubench.errors import InputError
    from gpubench.plugins import load_plugins
    from gpubench.settings import flatten_args
    from gpubench.suite import checked_settings, config_from

    load_plugins()

    def run(steps_per_round: int = 10, rounds: int = 10, warmup_rounds: int = 2, **settings: Any) -> TrainingRound:
        try:
            settings = checked_settings("gpubench_benchmark", flatten_args(settings))
            config = config_from(settings, "gpubench_benchmark")
        except (InputError, KeyError) as e:
            pytest.fail(str(e.args[0]), pytrace=False)
        if settings.get("batch_size") == "max":
            pytest.fail("gpubench_benchmark: batch_size: 'max' is searched by gpubench run and find-batch; "
                        "give a number (gpubench find-batch prints the largest that fits)", pytrace=False)
        if config.huge_pages != "off":
            pytest.fail(f"gpubench_benchmark: huge_pages = {config.huge_pages} is set as a worker starts; the fixture "
                        "trains in pytest's own process: use gpubench_ab or gpubench run", pytrace=False)
        if config.distributed:
            pytest.fail(f"gpubench_benchmark: parallelism: {config.parallelism} needs one process per rank; "
                        "the fixture benchmarks one process (single, grad-accum:N, dp:N, mirrored:N); "
                        "use gpubench run", pytrace=False)
        from gpubench.backends.base import Unsupported
        from gpubench.workloads.source import SourceError

        problem = unsupported = None
        try:
            round_ = TrainingRound(config, steps_per_round)
        except SourceError as e:  # a factory that cannot be imported or returns no model: one line
            problem = str(e)
        except Unsupported as e:  # a setting that cannot apply to this model
            unsupported = str(e)
        if problem is not None:
            pytest.fail(f"gpubench_benchmark: {problem}", pytrace=False)
        if unsupported is not None:
            pytest.skip(f"{config.config_id}: unsupported: {unsupported}")
        round_()  # cold start (allocation, autotuning, compilation) outside pytest-benchmark's rounds
        benchmark.extra_info.update({"config_id": config.config_id, "samples_per_round": round_.samples_per_round,
                                     "steps_per_round": steps_per_round})
        benchmark.pedantic(round_, rounds=rounds, iterations=1, warmup_rounds=warmup_rounds)
        if benchmark.stats is None:  # --benchmark-disable, or pytest-xdist's workers: the round ran once, untimed
            pytest.skip(f"gpubench_benchmark: {config.config_id} trained, untimed: pytest-benchmark is disabled "
                        "here (--benchmark-disable, or pytest-xdist's -n, under which it times nothing)")
        median = benchmark.stats.stats.median
        round_.throughput = round_.samples_per_round / median
        benchmark.extra_info["throughput_median"] = round_.throughput
        return round_

    return run


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("gpubench")
    group.addoption("--gpubench-baseline-path", metavar="DIR",
                    help="gpubench_ab: the checkout whose gpubench is the baseline side")


@dataclass(frozen=True)
class ABGate:
    """What ``gpubench_ab`` found: the verdict of each config, the gate's figures (the JSON of
    ``gpubench ab --json``) and the printed table."""

    verdicts: dict[str, str]  # config_id -> regressed, improved, unchanged, inconclusive, ...
    data: dict[str, Any]
    text: str

    @property
    def regressed(self) -> list[str]:
        return [c for c, v in self.verdicts.items() if v == "regressed"]


@pytest.fixture
def gpubench_ab(request: Any) -> Callable[..., ABGate]:
    """Gate configs between two checkouts with ``gpubench ab``: ``gpubench_ab(baseline_path=None,
    candidate_path=None, repeats=12, lockstep=True, budget="9m", threshold="3%",
    noise_floor="1%", alpha=0.01, fail=True, **config_settings)``. The baseline path defaults to
    ``--gpubench-baseline-path`` (no baseline: the test is skipped), the candidate to this
    gpubench. A settings value may be a list (a sweep of that key). With ``fail``, a config that
    regressed, or a repeat that failed, fails the test with the verdict table. Each call's suite,
    verdicts and run directories are kept (not in pytest's temporary folder, which pytest deletes:
    the table's ``reproduce:`` command must still run) in ``.gpubench/pytest-ab/<test>-<random>/``
    under pytest's root directory."""

    def run(baseline_path: str | None = None, candidate_path: str | None = None, repeats: int = 12,
            lockstep: bool = True, budget: str | None = "9m", threshold: str = THRESHOLD,
            noise_floor: str = NOISE_FLOOR, alpha: float = ALPHA, fail: bool = True, **settings: Any) -> ABGate:
        baseline_path = baseline_path or request.config.getoption("gpubench_baseline_path")
        if not baseline_path:
            pytest.skip("gpubench_ab: no baseline checkout (give --gpubench-baseline-path DIR or baseline_path=)")
        from gpubench.errors import InputError
        from gpubench.suite import suite_text
        from gpubench.workloads.source import ZOOS

        try:
            text = suite_text("pytest-ab", settings)
        except InputError as e:
            pytest.fail(f"gpubench_ab: {e}", pytrace=False)
        workloads = settings.get("workload")
        own = any(":" in str(w) and str(w).split(":")[0] not in ZOOS
                  for w in (workloads if isinstance(workloads, list) else [workloads]))
        if own and candidate_path is None:  # the user's factory: the candidate is this project's checkout
            candidate_path = str(request.config.rootpath)
        kept = Path(request.config.rootpath) / ".gpubench" / "pytest-ab"
        kept.mkdir(parents=True, exist_ok=True)
        here = Path(tempfile.mkdtemp(prefix=re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:80] + "-", dir=kept))
        suite, verdicts = here / "suite.toml", here / "verdicts.json"
        suite.write_text(text)
        cmd = [sys.executable, "-m", "gpubench", "ab", str(suite), "--baseline-python", sys.executable,
               "--candidate-python", sys.executable, "--baseline-path", str(baseline_path),
               *(["--candidate-path", str(candidate_path)] if candidate_path else []),
               "--repeats", str(repeats), "--threshold", threshold, "--noise-floor", noise_floor,
               "--alpha", str(alpha), "--out", str(here), "--json", str(verdicts),
               "--no-report", *(["--lockstep"] if lockstep else []), *(["--budget", budget] if budget else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "160"})
        text = proc.stdout + proc.stderr
        if proc.returncode not in (0, 1) or not verdicts.exists():
            last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
            pytest.fail(f"gpubench_ab: gpubench ab exited with {proc.returncode}: {last} (kept in {here})",
                        pytrace=False)
        data = json.loads(verdicts.read_text())
        gate = ABGate({v["config_id"]: v["verdict"] for v in data["verdicts"]}, data, text)
        if fail and (gate.regressed or data.get("failed")):
            what = (f"regressed: {', '.join(gate.regressed)}" if gate.regressed else
                    f"{len(data['failed'])} repeat(s) failed")
            pytest.fail(f"gpubench_ab: {what} (the suite, the verdicts and both sides' runs: {here})\n{proc.stdout}",
                        pytrace=False)
        return gate

    return run
