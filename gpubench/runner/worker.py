"""The worker: trains and measures one config in a fresh process.

``python -m gpubench.runner.worker WORKDIR`` reads ``WORKDIR/job.json`` and writes
``WORKDIR/result.json`` (atomically). Anything that goes wrong becomes a status in the
result: the parent only has to cope with a worker that produced no result at all (killed,
hung, crashed in native code).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import psutil

from gpubench.backends import get_backend
from gpubench.options import REPLICA_KINDS, parse_parallelism
from gpubench.errors import warn
from gpubench.measure.loop import RawMeasurement, run_loop
from gpubench.measure.stats import is_noisy, step_stats, throughput
from gpubench.results.schema import outcome
from gpubench.results.store import write_json_atomic
from gpubench.config import Config
from gpubench.workloads import get_workload
from gpubench.workloads.data import make_batches


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

    def start_training(self) -> None:
        self._before_training = _peak_rss_bytes()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._reset = True
        except OSError:  # not Linux, or not allowed: no training-only figure
            self._reset = False

    def lifetime(self) -> int:
        return max(self._before_training, _peak_rss_bytes())

    def training(self) -> int | None:
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
        "loss": {
            "first": raw.loss_first,
            "last": raw.loss_last,
            "windows": raw.window_losses,
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
        wall = sum(raw.window_wall_ms)
        steps = config.steps * len(raw.window_wall_ms)
        metrics["throughput_wall"] = config.samples_per_step * steps * 1000.0 / wall
    return metrics


def _start_telemetry(backend: Any, config: Config, host_pid: int | None = None) -> Any:
    """A started TelemetrySession, or None when sampling is off or cannot start."""
    if config.telemetry_interval_ms <= 0:
        return None
    from gpubench.telemetry.session import TelemetrySession

    try:
        return TelemetrySession(config.device, config.telemetry_interval_ms, backend.device_uuids(config),
                                host_pid=host_pid, ordinals=config.local_cuda_ordinals,
                                nodes=config.nnodes).start()
    except Exception as e:  # noqa: BLE001 - telemetry never fails a config
        print(f"gpubench: telemetry could not start: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def _stop_telemetry(session: Any, raw: RawMeasurement | None, config: Config) -> tuple[Any, Any]:
    if session is None:
        return ({"gpu": None, "gpu_reason": "telemetry off (telemetry_interval_ms = 0)"}
                if config.telemetry_interval_ms <= 0 else None), None
    try:
        phases = raw.phases if raw is not None else []
        measured = config.samples_per_step * config.steps * (len(raw.window_wall_ms) if raw is not None else 0)
        return session.stop(phases, measured)
    except Exception as e:  # noqa: BLE001
        return {"gpu": None, "gpu_reason": None, "errors": [f"telemetry failed: {type(e).__name__}: {e}"]}, None


def _profile(trainer: Any, raw: RawMeasurement, config: Config, options: dict[str, Any]) -> Any:
    """The profiling passes; a failure there fails the config, saying where it came from."""
    from gpubench.profile.capture import profile_trainer

    try:
        return profile_trainer(trainer, raw, config, options)
    except Exception as e:  # an OOM keeps its text, so that it still reads as oom
        raise RuntimeError(f"profiling failed: {_first_line(e)}") from e


def rank_of(config: Config) -> tuple[int, int]:
    """(this process's rank, the number of ranks) for the config; (0, 1) unless distributed."""
    if not config.distributed:
        return 0, 1
    return int(os.environ.get("RANK", "0")), config.devices


def rank_summaries(trainer: Any, raw: RawMeasurement, config: Config, rss: PeakRss) -> list[dict[str, Any]]:
    """Every rank's own figures, gathered in rank order (a collective, after the windows)."""
    median = step_stats(raw.step_times_ms).median if raw.step_times_ms else None
    mine = {"rank": trainer.rank, "node": int(os.environ.get("GROUP_RANK", "0")), "host": socket.gethostname(),
            "step_time_median_ms": median,
            "throughput": config.batch_size * 1000.0 / median if median else None,
            "peak_rss_bytes": rss.lifetime(), "weights_sha1": trainer.weights_digest(), **trainer.memory()}
    return trainer.all_gather(mine)


def run_config(config: Config, profile: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train and measure one config; always returns a (worker-side) result dict. With
    ``profile`` (``gpubench profile``: ``steps``, ``dir``, ``rel``), NVTX ranges mark the
    phases and the profiling passes follow the measured windows."""
    try:
        backend = get_backend(config.framework)
    except KeyError as e:
        return outcome("error", str(e.args[0]))
    try:
        verdict = backend.check(config)
    except ImportError as e:
        return outcome("unavailable", f"{config.framework} is not installed ({e}); install with: "
                                      f"{backend.install_hint}")
    if verdict is not None:
        return outcome(*verdict)
    reason = config.topology_unsupported()
    if reason:
        return outcome("unsupported", reason)

    spec = get_workload(config.workload).spec(**dict(config.workload_params))
    if config.dataset == "mnist" and (spec.input_shape != (1, 28, 28) or spec.num_classes != 10):
        return outcome("unsupported", f"dataset mnist needs a 1x28x28 input and 10 classes; {spec.name} takes "
                                      f"{'x'.join(map(str, spec.input_shape))} and {spec.num_classes}")
    model = {"params": spec.params, "flops_per_sample": spec.train_flops_per_sample,
             "forward_flops_per_sample": spec.forward_flops_per_sample}
    memory: dict[str, int] = {"baseline_rss_bytes": psutil.Process().memory_info().rss}
    rss = PeakRss()
    rank, world = rank_of(config)
    trainer = None
    try:
        if config.distributed and os.environ.get("WORLD_SIZE") != str(world):
            raise RuntimeError(f"{config.parallelism} needs {world} processes started by its launcher; this worker has "
                               f"WORLD_SIZE={os.environ.get('WORLD_SIZE')}")
        t0 = time.perf_counter()
        # one global batch = accum_steps x replicas micro-batches; each rank keeps its own
        # share (ddp, multiworker), or one process takes them all at once (dp, mirrored);
        # every pipeline stage sees the whole batch (the first feeds its inputs, the last its labels)
        batches = make_batches(spec, config.dataset, config.data_dir, config.batch_size, config.seed,
                               config.accum_steps * config.replicas)
        if config.distributed and config.replicas > 1:
            batches = batches.shard(rank, world)
        elif config.replicas > 1:
            batches = batches.merge(config.replicas)
        memory["data_bytes"] = batches.nbytes
        if profile is not None:
            backend.before_profiled_build(config)
        trainer = backend.build(spec, config, batches)
        del batches
        if config.distributed and os.environ.get("GPUBENCH_TEST_FAIL_RANK") == str(rank):  # tests' fault injection
            raise RuntimeError(f"injected failure on rank {rank} (GPUBENCH_TEST_FAIL_RANK)")
        setup_ms = (time.perf_counter() - t0) * 1000.0
        # rank 0 samples, every GPU of its node that the config uses; with several ranks its
        # host sampler watches the launcher's process tree, which holds every rank
        telemetry = (_start_telemetry(backend, config, os.getppid() if config.distributed else None)
                     if rank == 0 else None)
        raw: RawMeasurement | None = None
        rss.start_training()
        try:
            raw = run_loop(trainer, config.warmup_steps, config.steps, config.windows, telemetry,
                           ranges=trainer.ranges() if profile is not None else None)
        finally:  # the samplers stop whatever happens
            telemetry_block, timeline = _stop_telemetry(telemetry, raw, config)
        memory.update(trainer.memory())
        if rss.training() is not None:
            memory["train_peak_rss_bytes"] = rss.training()
        profiled = _profile(trainer, raw, config, profile) if profile is not None and not raw.diverged else None
        ranks = rank_summaries(trainer, raw, config, rss) if config.distributed else None
        trainer.close()
    except BaseException as e:  # noqa: BLE001 - every failure must become a status
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        memory["peak_rss_bytes"] = rss.lifetime()
        if backend.is_oom(e):
            if trainer is not None:
                try:
                    memory.update(trainer.memory())
                except Exception:  # noqa: BLE001 - the memory figures are best-effort here
                    pass
            return outcome("oom", _first_line(e), metrics={"memory": memory}, model=model)
        return outcome("error", _first_line(e), model=model, traceback=traceback.format_exc())
    memory["peak_rss_bytes"] = rss.lifetime()
    metrics = metrics_from(raw, config, setup_ms)
    metrics["memory"] = memory
    runtime = trainer.describe()
    if raw.compile_events_in_windows is not None:
        runtime.setdefault("compile", {})["events_in_windows"] = raw.compile_events_in_windows
        if raw.compile_events_in_windows:
            warn(f"{raw.compile_events_in_windows} compilation(s) inside the measured windows; raise warmup_steps")
    if profiled is not None:
        metrics.update(profiled[0])
    status, reason = ("ok", "")
    if raw.diverged:
        status, reason = "diverged", "loss became non-finite"
    if ranks is not None:
        metrics["ranks"] = ranks
    if ranks is not None and parse_parallelism(config.parallelism)[0] in REPLICA_KINDS:
        digests = {r["weights_sha1"] for r in ranks}
        metrics["ranks_weights_identical"] = len(digests) == 1 and None not in digests
        if not metrics["ranks_weights_identical"] and status == "ok":
            status, reason = "error", "the ranks ended with different weights (data-parallel replicas diverged)"
    return {
        "status": status,
        "reason": reason,
        "metrics": metrics,
        "telemetry": telemetry_block,
        "_timeline": timeline,
        "model": model,
        "runtime": runtime,
        **({"profile": profiled[1]} if profiled is not None and profiled[1] is not None else {}),
        "phases": [{"name": p.name, "start_ms": (p.start_ns - raw.phases[0].start_ns) / 1e6,
                    "end_ms": (p.end_ns - raw.phases[0].start_ns) / 1e6} for p in raw.phases],
    }


def main(argv: list[str]) -> int:
    workdir = Path(argv[0])
    job = json.loads((workdir / "job.json").read_text())
    from gpubench.plugins import load_plugins

    load_plugins()
    config = Config.from_dict(job["config"])
    code = _write_outcome(workdir, config, run_config(config, (job.get("options") or {}).get("profile")))
    if config.distributed:
        leave_now(code)
    return code


def _write_outcome(workdir: Path, config: Config, result: dict[str, Any]) -> int:
    """Hand the result over to the runner; the process's exit code."""
    rank, _ = rank_of(config)
    timeline = result.pop("_timeline", None)
    if rank > 0:  # rank 0 writes the config's result; another rank only its failure
        if result["status"] not in ("ok", "diverged"):
            result["reason"] = f"rank {rank}: {result['reason']}"
            write_json_atomic(workdir / f"result-rank{rank}.json", result)
            return 1  # torchrun then stops the other ranks
        return 0
    if timeline is not None:
        write_json_atomic(workdir / "timeline.json", timeline)
    write_json_atomic(workdir / "result.json", result)
    return 1 if config.distributed and result["status"] not in ("ok", "diverged") else 0


def leave_now(code: int) -> None:
    """End a rank's process without the interpreter's teardown, once its outcome is written.

    A collective's last reference can be dropped on the process group's own thread
    (``ProcessGroupGloo::runLoop``) after the main thread has moved on. When that happens while
    the interpreter finalises, the thread's decref of a Python-owned tensor cannot take the GIL,
    ``pthread_exit`` unwinds through C++ and the process aborts (SIGABRT, "terminate called
    without an active exception"): seen in about 1 of 20 two-node runs on a loaded CPU, with a
    core dump showing exactly that. The result files are complete by now, so nothing is lost.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
