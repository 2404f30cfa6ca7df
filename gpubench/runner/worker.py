"""The worker: trains and measures one config in a fresh process.

``python -m gpubench.runner.worker WORKDIR`` reads ``WORKDIR/job.json`` and writes
``WORKDIR/result.json`` (atomically). Anything that goes wrong becomes a status in the
result: the parent only has to cope with a worker that produced no result at all (killed,
hung, crashed in native code).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import resource
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

import gpubench
from gpubench import hugepages
from gpubench.backends import get_backend
from gpubench.backends.base import Backend, Evaluating, NativeModel, Trainer, Unsupported
from gpubench.config import Config
from gpubench.errors import EXIT_STORAGE, STORAGE_ERRNOS, STORAGE_LINE, warn
from gpubench.files import write_text_atomic
from gpubench.launch import FORKED_ENV, RANKS_ENV, die_with_parent
from gpubench.measure.loop import RawMeasurement, Target, run_loop, run_to_target
from gpubench.measure.stats import is_noisy, step_stats, throughput
from gpubench.measure.trace import reading
from gpubench.measure.turns import Turns
from gpubench.options import REPLICA_KINDS, SHARDED_KINDS, device_kind
from gpubench.results.result import Outcome
from gpubench.results.store import write_json_atomic
from gpubench.runner.job import PHASE_FILE
from gpubench.runner.launcher import NODE_ENV
from gpubench.runner.memory_history import MemoryRecording
from gpubench.runner.models import zoo_unavailable

if TYPE_CHECKING:
    from gpubench.telemetry.session import TelemetrySession


def _peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class PeakRss:
    """The worker's peak RSS over its life, and over training alone. Linux lets a process
    reset its peak mark (writing 5 to /proc/self/clear_refs), so the training peak does not
    include setup's transients (generating the synthetic pool); the lifetime peak is kept
    across the reset."""

    def __init__(self) -> None:
        self._before_training = 0
        self._reset = False

    @contextlib.contextmanager
    def training(self) -> Iterator[None]:
        """Around training: the peak mark is reset as it starts."""
        self._before_training = _peak_rss_bytes()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._reset = True
        except OSError:  # not Linux, or not allowed: no training-only figure
            self._reset = False
        yield

    def lifetime(self) -> int:
        return max(self._before_training, _peak_rss_bytes())

    def training_peak(self) -> int | None:
        return _peak_rss_bytes() if self._reset else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def metrics_from(raw: RawMeasurement, config: Config, setup_ms: float) -> dict[str, Any]:
    """The result's ``metrics`` block from a raw measurement (no memory figures)."""
    metrics: dict[str, Any] = {
        "warmup_steps_run": raw.warmup_steps,
        "samples_per_step": config.samples_per_step,
        "micro_batch_size": config.micro_batch_size,
        "effective_batch_size": config.samples_per_step,
        "accum_steps": config.accum_steps,
        "devices": config.devices,
        "nodes": config.nnodes,
        "setup_ms": setup_ms,
        "cold_start_ms": raw.cold_start_ms,
        "step_times_ms": raw.step_times_ms,
        "window_wall_ms": raw.window_wall_ms,
        "window_steps": raw.window_steps,
        "loss": {
            "first": raw.loss_first,
            "last": raw.loss_last,
            "windows": raw.window_losses,
            "curve": raw.losses,  # every step's, from the first: samples_per_step samples each
            "fell": bool(raw.loss_last < raw.loss_first) if not raw.diverged else False,
        },
    }
    if raw.step_times_ms:
        st = step_stats(raw.step_times_ms)
        metrics["step_time_ms"] = st.to_dict()
        metrics["throughput"] = throughput(st, config.samples_per_step).to_dict()
        metrics["throughput_per_device"] = metrics["throughput"]["median"] / config.devices
        metrics["noisy"] = is_noisy(st)
        # samples over wall time of the windows: includes anything between steps
        metrics["throughput_wall"] = config.samples_per_step * raw.steps_measured * 1000.0 / sum(raw.window_wall_ms)
    if raw.evaluations:
        metrics["target"] = _target_block(raw, config)
    if raw.compile_events_first:  # the first step compiled (torch.compile, jax.jit, tf.function)
        metrics["compile_s"] = raw.cold_start_ms / 1000.0
    for name in ("graph_breaks", "recompiles"):
        if (value := getattr(raw, name)) is not None:
            metrics[name] = value
    return metrics


def _training_status(out: Outcome, raw: RawMeasurement, config: Config) -> None:
    """``diverged`` where a loss became non-finite; ``target_not_reached`` where a target's
    evaluations never reached it, with the best and where it stopped."""
    if raw.diverged:
        out.status, out.reason = "diverged", "loss became non-finite"
    elif raw.evaluations and all(e.loss > config.target_loss for e in raw.evaluations):
        best, last = min(raw.evaluations, key=lambda e: e.loss), raw.evaluations[-1]
        out.status = "target_not_reached"
        out.reason = (f"target_loss {config.target_loss:g} not reached: the best held-out loss {best.loss:.4g} "
                      f"(after {best.steps} steps); stopped after {last.steps} steps and {last.elapsed_s:.1f} s "
                      f"(max_steps {config.max_steps}, max_time_s {config.max_time_s:g})")


def _target_block(raw: RawMeasurement, config: Config) -> dict[str, Any]:
    """A run to a target: every evaluation (steps, seconds from the first step, held-out loss),
    and where one reached it, the time, steps and samples to it and the evaluations' share of
    that time; where none did, no time at all (the status says target_not_reached), and where it
    stopped (the gate ranks it as slower than that)."""
    ev = raw.evaluations
    finite = [e.loss for e in ev if math.isfinite(e.loss)]
    hit = next((e for e in ev if e.loss <= config.target_loss), None)
    block: dict[str, Any] = {"loss": config.target_loss, "reached": hit is not None, "eval_every": config.eval_every,
                             "evaluations": [[e.steps, e.elapsed_s, e.loss] for e in ev],
                             "best_loss": min(finite) if finite else None}
    if hit is not None:
        eval_s = sum(e.eval_s for e in ev[:ev.index(hit) + 1])
        block.update(time_to_target_s=hit.elapsed_s, steps_to_target=hit.steps,
                     samples_to_target=hit.steps * config.samples_per_step, eval_s=eval_s,
                     eval_share=eval_s / hit.elapsed_s)
        if hit.energy_j is not None:
            block["energy_to_target_j"] = hit.energy_j
    elif ev:  # where it stopped: its time, steps and samples to the target are beyond these
        block.update(stopped_s=ev[-1].elapsed_s, stopped_steps=ev[-1].steps,
                     stopped_samples=ev[-1].steps * config.samples_per_step)
        if ev[-1].energy_j is not None:
            block["stopped_energy_j"] = ev[-1].energy_j
    return block


class Telemetry:
    """The samplers around the measured windows (rank 0 only; with several ranks its host
    sampler watches the launcher's process tree, which holds every rank). Stopped whatever
    happens; a sampler problem never fails the config: it becomes ``telemetry.errors``."""

    def __init__(self, backend: Backend, config: Config, rank: int) -> None:
        self.backend, self.config, self.rank = backend, config, rank
        self.session: TelemetrySession | None = None
        self.raw: RawMeasurement | None = None
        self.block: dict[str, Any] | None = None
        self.timeline: dict[str, Any] | None = None

    def __enter__(self) -> Telemetry:
        config = self.config
        if self.rank != 0 or config.telemetry_interval_ms <= 0:
            return self
        from gpubench.telemetry.session import TelemetrySession

        try:
            self.session = TelemetrySession(config.device, config.telemetry_interval_ms,
                                            self.backend.device_uuids(config),
                                            host_pid=os.getppid() if config.distributed else None,
                                            ordinals=config.local_cuda_ordinals, nodes=config.nnodes).start()
        except Exception as e:  # noqa: BLE001 - telemetry never fails a config
            warn(f"telemetry could not start: {type(e).__name__}: {e}")
        return self

    @property
    def observer(self) -> TelemetrySession | None:
        """What the loop tells of each window's start and end (energy counters)."""
        return self.session

    def energy_j(self) -> float | None:
        """The config's devices' cumulative energy counter in J, None where none reads (a CPU)."""
        return self.session.energy_j() if self.session is not None else None

    def __exit__(self, *exc: object) -> None:
        config, raw = self.config, self.raw
        if self.rank != 0:
            return
        if self.session is None:
            if config.telemetry_interval_ms <= 0:
                self.block = {"gpu": None, "gpu_reason": "telemetry off (telemetry_interval_ms = 0)"}
            return
        try:
            phases = raw.phases if raw is not None else []
            samples = config.samples_per_step * raw.steps_measured if raw is not None else 0
            self.block, self.timeline = self.session.stop(phases, samples)
        except Exception as e:  # noqa: BLE001
            self.block = {"gpu": None, "gpu_reason": None, "errors": [f"telemetry failed: {type(e).__name__}: {e}"]}


def _profile(trainer: Trainer, raw: RawMeasurement, config: Config, options: dict[str, Any]
             ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The profiling passes; a failure there fails the config, saying where it came from."""
    from gpubench.runner.profiling import profile_trainer

    try:
        return profile_trainer(trainer, raw, config, options)
    except Exception as e:  # an OOM keeps its text, so that it still reads as oom
        raise RuntimeError(f"profiling failed: {_first_line(e)}") from e


def cpu_use(config: Config, out: Outcome) -> dict[str, Any] | None:
    """What a CPU config's profile reading weighs (measure.trace.oversubscription): the threads
    it trained with, the machine's cores and the cores other processes used over its windows."""
    if device_kind(config.device) != "cpu":
        return None
    host = (out.telemetry or {}).get("host") or {}
    return {"threads": (out.runtime or {}).get("num_threads") or config.threads or None,
            "cores": host.get("cores") or psutil.cpu_count(), "others_cores": host.get("others_cores")}


def rank_of(config: Config) -> tuple[int, int]:
    """(this process's rank, the number of ranks) for the config; (0, 1) unless distributed."""
    if not config.distributed:
        return 0, 1
    return int(os.environ.get("RANK", "0")), config.devices


def rank_summaries(trainer: Trainer, raw: RawMeasurement, config: Config, rss: PeakRss) -> list[dict[str, Any]]:
    """Every rank's own figures, gathered in rank order (a collective, after the windows)."""
    median = step_stats(raw.step_times_ms).median if raw.step_times_ms else None
    mine = {"rank": trainer.rank, "node": int(os.environ.get("GROUP_RANK", "0")), "host": socket.gethostname(),
            "step_time_median_ms": median,
            "throughput": config.batch * 1000.0 / median if median else None,
            "peak_rss_bytes": rss.lifetime(), "weights_sha1": trainer.weights_digest(), **trainer.memory(),
            **_state(trainer)}
    gathered: list[dict[str, Any]] = trainer.all_gather(mine)
    return gathered


def _state(trainer: Trainer) -> dict[str, Any]:
    """``state_bytes_per_device`` (this device's parameters, gradients and optimizer state) and
    its parts under ``state_bytes``; nothing where the trainer does not count them."""
    parts = trainer.state_bytes()
    return {} if parts is None else {"state_bytes_per_device": sum(parts.values()), "state_bytes": parts}


def admit(config: Config) -> Backend | Outcome:
    """The config's backend, or the outcome of a config that cannot run here."""
    try:
        backend = get_backend(config.framework)
    except KeyError as e:
        return Outcome(status="error", reason=str(e.args[0]))
    try:
        verdict = backend.check(config)
    except ImportError as e:
        return Outcome(status="unavailable", reason=f"{config.framework} is not installed ({e}); install with: "
                                                    f"{backend.install_hint}")
    if verdict is not None:
        return Outcome(status=verdict[0], reason=verdict[1])
    for module in backend.fork_preload or ():  # what a fork server imports first, a spawned worker too:
        with contextlib.suppress(ImportError):  # its setup time and memory figures are then a forked one's
            importlib.import_module(module)
    reason = (config.topology_unsupported() or hugepages.unavailable(config.huge_pages)
              or (backend.set_threads(config.threads) if config.threads else None))
    if reason:
        return Outcome(status="unsupported", reason=reason)
    return backend


def build_trainer(backend: Backend, native: NativeModel, config: Config, rank: int, world: int, profiling: bool
                  ) -> tuple[Trainer, int]:
    """The trainer with its share of the data: each rank keeps its own share of a global batch
    (ddp, multiworker), or one process takes them all at once (dp, mirrored); every pipeline
    stage sees the whole batch (the first feeds its inputs, the last its labels), every
    tensor-parallel rank its replica's. Returns the
    trainer and the bytes of its data pool."""
    if config.distributed and os.environ.get("WORLD_SIZE") != str(world):
        raise RuntimeError(f"{config.parallelism} needs {world} processes started by its launcher; this worker has "
                           f"WORLD_SIZE={os.environ.get('WORLD_SIZE')}")
    batches = native.make_batches(config.batch, config.accum_steps * config.replicas)
    if config.distributed and config.replicas > 1:  # fsdp:A+tp:B: ranks r.B .. r.B + B-1 are replica r
        batches = batches.shard(rank // config.tensor_parallel, world // config.tensor_parallel)
    elif config.replicas > 1:
        batches = batches.merge(config.replicas)
    if profiling:
        backend.before_profiled_build(config)
    return backend.build(native, config, batches), batches.nbytes


def _target(trainer: Trainer, native: NativeModel, config: Config, energy: Callable[[], float | None]
            ) -> Target | None:
    """A ``target_loss`` config's run to its target: the trainer evaluates the source's held-out
    batches (the synthetic task's held-out draw, a data set's held-out split), ``energy`` reads
    the devices' energy counter; None without a target. Unsupported where the source has no
    held-out batches or the trainer does not evaluate."""
    if config.target_loss <= 0:
        return None
    if native.eval_batches is None:
        raise Unsupported(f"target_loss: dataset {config.dataset} has no held-out split here (mnist: the t10k "
                          "files in data_dir; your data set: held_out)")
    if not isinstance(trainer, Evaluating) or config.distributed:
        raise Unsupported(f"target_loss: {config.parallelism} does not evaluate held-out batches yet")
    held_out = native.eval_batches(config.batch)
    return Target(config.target_loss, config.eval_every, config.max_steps, config.max_time_s,
                  partial(trainer.evaluate, held_out), energy)


def _input_refused(config: Config, native: NativeModel) -> Outcome | None:
    """``unsupported`` for a built-in whose input MNIST cannot feed (a factory's model is run on
    MNIST's first samples by the pre-run check)."""
    spec = native.spec
    if config.dataset == "mnist" and spec is not None and (spec.input_shape != (1, 28, 28) or spec.num_classes != 10):
        takes = f"{'x'.join(map(str, spec.input_shape))} and {spec.num_classes}"
        return Outcome(status="unsupported", reason=f"dataset mnist needs a 1x28x28 input and 10 classes; "
                                                    f"{config.workload} takes {takes}")
    return None


def _worker_runtime(config: Config, turns: Turns) -> dict[str, Any]:
    """What the worker itself adds to the runtime: which gpubench trained (gpubench ab: each
    side's own checkout), how it started, the lockstep turns, what it held in huge pages as it
    finished."""
    forked = os.environ.get(FORKED_ENV)
    runtime: dict[str, Any] = {"gpubench": {"version": gpubench.__version__,
                                            "path": str(Path(gpubench.__file__).resolve().parent)},
                               "worker_start": "spawn" if forked is None else f"fork ({forked or 'gpubench'} imported)"}
    if turns.describe() is not None:
        runtime["lockstep"] = turns.describe()
    if config.target_loss > 0:  # a target's repeat: the seeds it started from
        from gpubench.workloads.data import train_draw

        runtime["trial"] = {"trial": config.trial, "init_seed": config.init_seed, "data_draw": train_draw(config.trial)}
    if config.huge_pages != "off":
        runtime["huge_pages"] = {"setting": config.huge_pages, "kernel": hugepages.kernel_mode(),
                                 "anon_huge_bytes": hugepages.anon_huge_bytes()}
    return runtime


def run_config(config: Config, profile: dict[str, Any] | None = None, memory_history: dict[str, Any] | None = None,
               counts: Path | None = None, phase: Callable[[str], None] = lambda text: None,
               ) -> tuple[Outcome, dict[str, Any] | None]:
    """Train and measure one config: (its outcome, its telemetry timeline or None). Never
    raises for a config's failure: every one becomes a status. With ``profile``
    (``gpubench profile``: ``steps``, ``dir``, ``rel``), NVTX ranges mark the phases and the
    profiling passes follow the measured windows; with ``memory_history`` (``dir``, ``rel``)
    the device allocator's history is recorded from before the build (runner.memory_history);
    ``counts``: the run's directory of model FLOP counts (a model counted once a run);
    ``phase`` is told what the worker is doing as each phase begins (its heartbeat)."""
    phase("starting: importing the framework")
    backend = admit(config)
    if isinstance(backend, Outcome):
        return backend, None
    try:
        phase("building the model")
        native = backend.native(config, counts)
    except Exception as e:  # noqa: BLE001 - a factory or zoo model that cannot be built: the config's error
        missing = zoo_unavailable(config)
        if missing:
            return Outcome(status="unavailable", reason=missing), None
        return _failure(e, backend, None, {}, PeakRss(), {"source": config.workload}, None), None
    if (refused := _input_refused(config, native)) is not None:
        return refused, None
    model = dict(native.facts)
    if model.get("recomputed_flops_per_sample") is not None and model.get("flops_per_sample"):
        # hardware FLOPs: what the device computes, with the forward checkpointing recomputes
        model["hardware_flops_per_sample"] = model["flops_per_sample"] + model["recomputed_flops_per_sample"]
    memory: dict[str, Any] = {"baseline_rss_bytes": psutil.Process().memory_info().rss}
    rss = PeakRss()
    rank, world = rank_of(config)
    telemetry = Telemetry(backend, config, rank)
    turns = Turns.from_env(config.timeout_s)
    trainer = None
    recording = MemoryRecording(backend, config, memory_history, rank)
    try:
        t0 = time.perf_counter()
        phase("setting up the trainer (data, optimizer, compilation)")
        trainer, memory["data_bytes"] = build_trainer(backend, native, config, rank, world, profile is not None)
        setup_ms = (time.perf_counter() - t0) * 1000.0
        target = _target(trainer, native, config, telemetry.energy_j)
        ranges = trainer.ranges() if profile is not None else None
        with telemetry, rss.training():
            telemetry.raw = raw = (run_to_target(trainer, target, progress=phase, turns=turns)
                                   if target is not None else
                                   run_loop(trainer, config.warmup_steps, config.steps, config.windows,
                                            telemetry.observer, ranges=ranges, window_s=config.window_s, turns=turns,
                                            progress=phase))
        memory.update(trainer.memory())
        memory.update(_state(trainer))
        training_peak = rss.training_peak()
        if training_peak is not None:
            memory["train_peak_rss_bytes"] = training_peak
        profiled = None
        if profile is not None and not raw.diverged:
            phase(f"profiling ({profile.get('steps')} steps)")
            profiled = _profile(trainer, raw, config, profile)
        ranks = rank_summaries(trainer, raw, config, rss) if config.distributed else None
        trainer.close()
    except Exception as e:  # noqa: BLE001 - every failure must become a status
        return _failure(e, backend, trainer, memory, rss, model, recording), telemetry.timeline
    memory["peak_rss_bytes"] = rss.lifetime()
    out = Outcome(status="ok", metrics={**metrics_from(raw, config, setup_ms), "memory": memory},
                  telemetry=telemetry.block, model=model, runtime=trainer.describe(), phases=phase_marks(raw))
    _note_compiles(out, raw)
    out.runtime = {**(out.runtime or {}), **_worker_runtime(config, turns)}
    if native.data:  # a data set's: what its pool and held-out batches held
        out.runtime["dataset"] = native.data
    if profiled is not None:
        out.with_metrics(**profiled[0])
        out.profile = profiled[1]
        if out.profile is not None and out.profile.get("trace_breakdown") is not None:
            out.profile["reading"] = reading(out.profile["trace_breakdown"], cpu_use(config, out))
    history = recording.finish()
    if history is not None:
        out.profile = {**(out.profile or {}), "memory_history": history}
    if recording.runtime() is not None:
        out.runtime["memory_history"] = recording.runtime()
    _training_status(out, raw, config)
    if ranks is not None:
        _check_ranks(out, ranks, config)
    return out, telemetry.timeline


def _failure(e: BaseException, backend: Backend, trainer: Trainer | None, memory: dict[str, Any], rss: PeakRss,
             model: dict[str, Any], recording: MemoryRecording | None) -> Outcome:
    """The outcome of a config whose build, training or profiling raised: ``oom`` with the
    memory figures known so far and the allocator's state at the failure (``metrics.oom``,
    where the framework has an allocator snapshot), else ``error`` with the traceback."""
    memory["peak_rss_bytes"] = rss.lifetime()
    if isinstance(e, Unsupported):
        return Outcome(status="unsupported", reason=str(e), model=model)
    if backend.is_oom(e):
        if trainer is not None:
            try:
                memory.update(trainer.memory())
            except Exception:  # noqa: BLE001 - the memory figures are best-effort here
                pass
        metrics: dict[str, Any] = {"memory": memory}
        if recording is not None:
            oom = recording.at_failure()
            if oom is not None:
                metrics["oom"] = oom
            if recording.runtime() is not None:
                return Outcome(status="oom", reason=_first_line(e), metrics=metrics, model=model,
                               runtime={"memory_history": recording.runtime()})
        return Outcome(status="oom", reason=_first_line(e), metrics=metrics, model=model)
    return Outcome(status="error", reason=_first_line(e), model=model, traceback=traceback.format_exc())


def phase_marks(raw: RawMeasurement) -> list[dict[str, Any]]:
    """The loop's phases in ms from the start of the cold-start step (the result's ``phases``)."""
    t0 = raw.phases[0].start_ns
    return [{"name": p.name, "start_ms": (p.start_ns - t0) / 1e6, "end_ms": (p.end_ns - t0) / 1e6} for p in raw.phases]


def _note_compiles(out: Outcome, raw: RawMeasurement) -> None:
    if raw.compile_events_in_windows is None:
        return
    runtime = out.runtime if out.runtime is not None else {}
    runtime.setdefault("compile", {})["events_in_windows"] = raw.compile_events_in_windows
    out.runtime = runtime
    if raw.compile_events_in_windows:
        warn(f"{raw.compile_events_in_windows} compilation(s) inside the measured windows; raise warmup_steps")


def _check_ranks(out: Outcome, ranks: list[dict[str, Any]], config: Config) -> None:
    """Every rank's figures in the result; data-parallel ranks that ended with different
    weights make the config ``error``."""
    out.with_metrics(ranks=ranks)
    kind = config.parallel.kind
    if kind not in REPLICA_KINDS or kind in SHARDED_KINDS:  # each rank holds its own part of a sharded model
        return
    digests = {r["weights_sha1"] for r in ranks}
    identical = len(digests) == 1 and None not in digests
    out.with_metrics(ranks_weights_identical=identical)
    if not identical and out.status == "ok":
        out.status, out.reason = "error", "the ranks ended with different weights (data-parallel replicas diverged)"


def _phase(workdir: Path, config: Config, text: str) -> None:
    """Rank 0 says what it does now (``PHASE_FILE``: the phase and when it began); never fails
    the config."""
    if rank_of(config)[0] != 0:
        return
    try:
        write_text_atomic(workdir / PHASE_FILE, json.dumps({"phase": text, "since": time.time()}))
    except OSError:
        pass


def main(argv: list[str]) -> int:
    die_with_parent()  # a rank under a launcher: gone with it
    workdir = Path(argv[0])
    job = json.loads((workdir / "job.json").read_text())
    options = job.get("options") or {}
    if os.environ.get(RANKS_ENV) == "slurm":  # a Slurm task per rank: its rank variables from Slurm's
        from gpubench.runner.slurm import slurm_ranks

        os.environ.update(slurm_ranks(dict(os.environ)))
    from gpubench.plugins import load_plugins

    load_plugins()
    config = Config.from_dict(job["config"])
    if config.target_loss > 0:  # time to quality varies from seed to seed: each repeat its own trial
        config = replace(config, trial=int(job.get("repeat") or 0))
    # the run's FLOP counts of its models, beside the jobs' work directories (run_dir/.work/JOB)
    outcome, timeline = run_config(config, options.get("profile"), options.get("memory_history"),
                                   counts=workdir.parent / "model-flops", phase=partial(_phase, workdir, config))
    if options.get(NODE_ENV) and rank_of(config)[0] == 0:  # run elsewhere: the fingerprint of the node it ran on
        outcome.runtime = {**(outcome.runtime or {}), NODE_ENV: _node_env(config.framework)}
    code = _write_outcome(workdir, config, outcome, timeline)
    leave_now(code)  # the outcome is written: the interpreter's teardown is no part of the config's cost
    return code


def _node_env(framework: str) -> dict[str, Any]:
    """This node's fingerprint with the framework's probe; where that fails, the host name and
    why (the outcome matters more than its fingerprint)."""
    from gpubench.env import fingerprint
    from gpubench.runner.probe import probe_here

    try:
        return fingerprint({framework: probe_here(framework).to_dict()})
    except Exception as e:  # noqa: BLE001 - any failure of a probe must not cost the outcome
        return {"hostname": socket.gethostname(), "fingerprint_error": _first_line(e)}


def _write_outcome(workdir: Path, config: Config, outcome: Outcome, timeline: dict[str, Any] | None) -> int:
    """Hand the outcome over to the runner; the process's exit code."""
    rank, _ = rank_of(config)
    if rank > 0:  # rank 0 writes the config's outcome; another rank only its failure
        if outcome.status not in ("ok", "diverged"):
            outcome.reason = f"rank {rank}: {outcome.reason}"
            write_json_atomic(workdir / f"result-rank{rank}.json", outcome.outcome_json())
            return 1  # the launcher then stops the other ranks
        return 0
    try:
        if timeline is not None:
            write_json_atomic(workdir / "timeline.json", timeline)
        write_json_atomic(workdir / "result.json", outcome.outcome_json())
    except OSError as e:
        if e.errno not in STORAGE_ERRNOS:
            raise
        # not the config's failure: the runner records nothing and says so (EXIT_STORAGE)
        print(f"{STORAGE_LINE} in {workdir}: {e.strerror or e}", file=sys.stderr, flush=True)
        return EXIT_STORAGE
    return 1 if config.distributed and outcome.status not in ("ok", "diverged") else 0


def leave_now(code: int) -> None:
    """End the worker without the interpreter's teardown, once its outcome is written.

    The teardown frees every module and object a framework made (docs/performance.md measures
    what it cost a tiny config) and is nobody's figure. For a
    rank it is also a hazard: a collective's last reference can be dropped on the process
    group's own thread (``ProcessGroupGloo::runLoop``) after the main thread has moved on; when
    that happens while the interpreter finalises, the thread's decref of a Python-owned tensor
    cannot take the GIL, ``pthread_exit`` unwinds through C++ and the process aborts (SIGABRT,
    "terminate called without an active exception"): seen in about 1 of 20 two-node runs on a
    loaded CPU. The result files are complete by now; the standard streams and the user's
    logging handlers are flushed, so nothing is lost."""
    if "logging" in sys.modules:  # a user's model may log to a file of its own
        sys.modules["logging"].shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
