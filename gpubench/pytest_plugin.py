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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


class TrainingRound:
    """``steps_per_round`` training steps followed by a device synchronisation."""

    def __init__(self, config: Any, steps_per_round: int) -> None:
        from gpubench.backends import get_backend
        from gpubench.workloads import get_workload
        from gpubench.workloads.data import make_batches

        backend = get_backend(config.framework)
        try:
            verdict = backend.check(config)
        except ImportError as e:
            pytest.skip(f"{config.framework} is not installed ({e})")
        if verdict is not None:
            pytest.skip(f"{config.config_id}: {verdict[0]}: {verdict[1]}")
        reason = backend.set_threads(config.threads) if config.threads else None
        if reason:
            pytest.skip(f"{config.config_id}: unsupported: {reason}")
        spec = get_workload(config.workload).spec(**dict(config.workload_params))
        batches = make_batches(spec, config.dataset, config.data_dir, config.batch_size, config.seed)
        self.config = config
        self.trainer = backend.build(spec, config, batches)
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
    framework, device, batch_size, precision, ...; workload parameters such as depth too)."""
    from gpubench.errors import InputError
    from gpubench.plugins import load_plugins
    from gpubench.suite import Config, checked_settings
    from gpubench.workloads import get_workload

    load_plugins()

    def run(steps_per_round: int = 10, rounds: int = 10, warmup_rounds: int = 2, **settings: Any) -> TrainingRound:
        try:
            settings = checked_settings("gpubench_benchmark", settings)
            workload = get_workload(settings.get("workload", ""))
        except (InputError, KeyError) as e:
            pytest.fail(str(e.args[0]), pytrace=False)
        if settings.get("batch_size") == "max":
            pytest.fail("gpubench_benchmark: batch_size: 'max' is searched by gpubench run and find-batch; "
                        "give a number (gpubench find-batch prints the largest that fits)", pytrace=False)
        params = {p.name: settings.pop(p.name, p.default) for p in workload.params}
        config = Config(**settings, workload_params=tuple(sorted(params.items())))
        if config.distributed:
            pytest.fail(f"gpubench_benchmark: parallelism: {config.parallelism} needs one process per rank; "
                        "the fixture benchmarks one process (single, grad-accum:N, dp:N, mirrored:N); "
                        "use gpubench run", pytrace=False)
        round_ = TrainingRound(config, steps_per_round)
        round_()  # cold start (allocation, autotuning, compilation) outside pytest-benchmark's rounds
        benchmark.extra_info.update({"config_id": config.config_id, "samples_per_round": round_.samples_per_round,
                                     "steps_per_round": steps_per_round})
        benchmark.pedantic(round_, rounds=rounds, iterations=1, warmup_rounds=warmup_rounds)
        median = benchmark.stats.stats.median
        round_.throughput = round_.samples_per_round / median
        benchmark.extra_info["throughput_median"] = round_.throughput
        return round_

    return run
