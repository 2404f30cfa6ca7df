"""The measurement loop against a scripted trainer and clock-free timer."""

from __future__ import annotations

import math

from gpubench.backends.base import Trainer
from gpubench.measure.loop import run_loop
from gpubench.runner.worker import metrics_from
from gpubench.suite import Config


class ScriptedTimer:
    def __init__(self, log: list[str], times: list[float]) -> None:
        self.log, self.times, self.marks = log, times, 0

    def mark(self) -> None:
        self.log.append("mark")
        self.marks += 1

    def elapsed_ms(self) -> list[float]:
        return [self.times.pop(0) for _ in range(self.marks - 1)]


class ScriptedTrainer(Trainer):
    """Records the call sequence; the steps before the n-th read have the loss 10 - n (they fall
    by one a read), or NaN after ``nan_after_reads`` reads."""

    def __init__(self, times: list[float], nan_after_reads: int | None = None) -> None:
        self.log: list[str] = []
        self.times = times
        self.reads = 0
        self.unread = 0
        self.nan_after_reads = nan_after_reads

    def step(self) -> None:
        self.log.append("step")
        self.unread += 1

    def sync(self) -> None:
        self.log.append("sync")

    def read_losses(self) -> list[float]:
        self.log.append("read")
        self.reads += 1
        n, self.unread = self.unread, 0
        if self.nan_after_reads is not None and self.reads > self.nan_after_reads:
            return [math.nan] * n
        return [10.0 - self.reads] * n

    def step_timer(self, n_steps: int) -> ScriptedTimer:
        return ScriptedTimer(self.log, self.times)

    def memory(self) -> dict[str, int]:
        return {}


def test_loop_structure_no_sync_or_loss_read_inside_windows():
    trainer = ScriptedTrainer(times=[float(i) for i in range(1, 7)])
    raw = run_loop(trainer, warmup_steps=2, steps=3, windows=2)
    # cold step, sync, read; 2 warm-up steps, sync, read; per window: mark + 3 x (step, mark), sync, read
    window = ["mark"] + ["step", "mark"] * 3 + ["sync", "read"]
    assert trainer.log == ["step", "sync", "read", "step", "step", "sync", "read"] + window * 2
    assert raw.step_times_ms == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert [p.name for p in raw.phases] == ["cold_start", "warmup", "window_0", "window_1"]
    assert all(p.end_ns >= p.start_ns for p in raw.phases)
    # every step's loss, read between the timed regions
    assert raw.losses == [9.0, 8.0, 8.0, 7.0, 7.0, 7.0, 6.0, 6.0, 6.0] and not raw.diverged
    assert raw.window_losses == [7.0, 6.0] and raw.loss_first == 9.0 and raw.loss_last == 6.0
    assert len(raw.window_wall_ms) == 2


def test_loop_stops_at_the_first_non_finite_loss():
    trainer = ScriptedTrainer(times=[1.0] * 9, nan_after_reads=3)  # reads: cold start, warm-up, window 1
    raw = run_loop(trainer, warmup_steps=0, steps=3, windows=3)
    assert raw.diverged
    assert len(raw.window_losses) == 2 and math.isnan(raw.window_losses[-1])
    assert len(raw.step_times_ms) == 6  # the third window never ran

    cold_nan = ScriptedTrainer(times=[], nan_after_reads=0)
    raw = run_loop(cold_nan, warmup_steps=5, steps=3, windows=3)
    assert raw.diverged and raw.step_times_ms == [] and cold_nan.log == ["step", "sync", "read"]


def test_metrics_from_raw_measurement():
    trainer = ScriptedTrainer(times=[10.0, 10.0, 20.0, 20.0])
    raw = run_loop(trainer, warmup_steps=0, steps=2, windows=2)
    m = metrics_from(raw, Config(workload="cnn", batch_size=50), setup_ms=5.0)
    assert m["samples_per_step"] == 50
    assert m["step_time_ms"]["median"] == 15.0
    assert m["throughput"]["median"] == 50 * 1000 / 15.0
    # no warm-up step (its read returns nothing), then two windows of two steps
    assert m["loss"] == {"first": 9.0, "last": 6.0, "windows": [7.0, 6.0], "fell": True,
                         "curve": [9.0, 7.0, 7.0, 6.0, 6.0]}
    assert m["step_times_ms"] == [10.0, 10.0, 20.0, 20.0]
    assert m["noisy"] is True  # cv of 10,10,20,20 is 0.38


class SleepingTrainer(ScriptedTrainer):
    """Each step takes ``step_s`` of wall time (a slow config, e.g. emulated bf16)."""

    def __init__(self, step_s: float) -> None:
        super().__init__(times=[step_s * 1000.0] * 1000)
        self.step_s = step_s

    def step(self) -> None:
        import time

        time.sleep(self.step_s)
        super().step()


def test_window_steps_fit_the_time_bound_but_never_fewer_than_two():
    from gpubench.measure.loop import MIN_WINDOW_STEPS, window_steps

    assert window_steps(20, 0.0, 500.0) == 20  # no bound
    assert window_steps(20, 1.0, 100.0) == 10
    assert window_steps(20, 1.0, 10.0) == 20  # never more than asked
    assert window_steps(20, 1.0, 3000.0) == MIN_WINDOW_STEPS == 2
    assert window_steps(1, 1.0, 3000.0) == 1  # never more than asked either


def test_a_time_bounded_loop_takes_fewer_steps_in_every_window_of_a_slow_config():
    trainer = SleepingTrainer(0.05)
    raw = run_loop(trainer, warmup_steps=20, steps=50, windows=3, window_s=0.12)
    # the warm-up stops once 0.12 s have passed (3 steps of 0.05 s; 2 if sleeps overshoot on a
    # loaded machine), not after its 20 steps; windows take what fits (2)
    assert 2 <= raw.warmup_steps <= 3
    assert raw.window_steps == [2, 2, 2] and len(raw.step_times_ms) == 6 and raw.steps_measured == 6
    fast = run_loop(SleepingTrainer(0.001), warmup_steps=3, steps=5, windows=2, window_s=1.0)
    assert (fast.warmup_steps, fast.window_steps) == (3, [5, 5])  # a fast config is not cut
    unbounded = run_loop(SleepingTrainer(0.05), warmup_steps=2, steps=4, windows=2)
    assert (unbounded.warmup_steps, unbounded.window_steps) == (2, [4, 4])


def test_a_time_bound_keeps_the_warm_up_a_compiling_trainer_needs():
    trainer = SleepingTrainer(0.05)
    trainer.min_warmup_steps = 4  # e.g. CUDA graphs recorded on the first calls
    raw = run_loop(trainer, warmup_steps=1, steps=10, windows=1, window_s=0.01)
    assert raw.warmup_steps == 4 and raw.window_steps == [2]


def test_window_s_is_a_suite_setting_checked_like_the_others():
    import pytest

    from gpubench.errors import InputError
    from gpubench.suite import parse_suite

    suite = parse_suite({"defaults": {"workload": "mlp", "window_s": 0.5}}, "s.toml")
    (config,) = suite.expand()
    assert config.window_s == 0.5 and "window_s" not in config.config_id  # a measurement setting
    assert config.config_hash != Config(workload="mlp").config_hash
    for bad in (-1, "1s", float("nan"), float("inf")):
        with pytest.raises(InputError, match="s.toml: defaults.window_s: "):
            parse_suite({"defaults": {"workload": "mlp", "window_s": bad}}, "s.toml")


def test_a_run_to_a_target_reads_the_energy_over_the_time_to_it():
    """energy_to_target_j: the devices' counter read before the clock starts and after each
    evaluation, each evaluation's energy from the first; the target block has it where reached,
    where the run stopped otherwise, and no figure where no counter reads (a CPU)."""
    from gpubench.measure.loop import Target, run_to_target
    from gpubench.runner.worker import _target_block

    counter = iter([100.0, 130.0, 170.0, 220.0])  # J, as NVML's counter reads (in mJ) summed
    losses = iter([3.0, 2.0, 1.0])
    config = Config(workload="mlp", batch_size=8, target_loss=1.5, eval_every=2, max_steps=6)
    target = Target(1.5, 2, 6, 60.0, lambda: next(losses), lambda: next(counter))
    raw = run_to_target(ScriptedTrainer([1.0] * 100), target)
    assert [e.energy_j for e in raw.evaluations] == [30.0, 70.0, 120.0]
    block = _target_block(raw, config)
    assert block["energy_to_target_j"] == 120.0 and block["steps_to_target"] == 6
    missed = _target_block(raw, Config(workload="mlp", batch_size=8, target_loss=0.5))
    assert missed["stopped_energy_j"] == 120.0 and "energy_to_target_j" not in missed
    cpu = run_to_target(ScriptedTrainer([1.0] * 100), Target(1.5, 2, 6, 60.0, iter([3.0, 1.0]).__next__))
    assert [e.energy_j for e in cpu.evaluations] == [None, None] and "energy_to_target_j" not in _target_block(
        cpu, config)
