"""The child of benchmarks/fixed_cost.py: one tiny config through the worker's own functions, in
the order ``gpubench.runner.worker.run_config`` calls them, each part timed; prints one JSON line
(the seconds of each part, and ``marks``: the wall clock at its first line and after its last
part, for the parent's spawn and exit figures).

    python benchmarks/_fixed_cost_child.py FRAMEWORK
"""

import time

MARKS = [time.time()]  # before anything is imported

import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(framework: str) -> dict:
    figures = {}
    t = time.perf_counter()
    from gpubench.runner import worker
    from gpubench.config import Config
    from gpubench.measure.loop import run_loop
    from gpubench.plugins import load_plugins
    from gpubench.results.result import Outcome
    from gpubench.results.store import write_json_atomic

    load_plugins()
    figures["gpubench_imports_s"] = time.perf_counter() - t
    params = (("mode", 0),) if framework == "fake" else (("depth", 1), ("width", 32))
    config = Config(workload="fault" if framework == "fake" else "mlp", framework=framework, workload_params=params,
                    batch_size=8, warmup_steps=0, steps=1, windows=1, threads=1)
    t = time.perf_counter()
    backend = worker.admit(config)
    assert not isinstance(backend, Outcome), backend
    figures["framework_s"] = time.perf_counter() - t
    t = time.perf_counter()
    native = backend.native(config, None)  # no run directory: the FLOPs counted here, as a run's first worker does
    figures["model_s"] = time.perf_counter() - t
    t = time.perf_counter()
    trainer, _ = worker.build_trainer(backend, native, config, 0, 1, False)
    figures["trainer_s"] = time.perf_counter() - t
    telemetry = worker.Telemetry(backend, config, 0)
    t = time.perf_counter()
    telemetry.__enter__()
    figures["telemetry_start_s"] = time.perf_counter() - t
    t = time.perf_counter()
    raw = run_loop(trainer, config.warmup_steps, config.steps, config.windows, telemetry.observer)
    figures["training_s"] = time.perf_counter() - t
    telemetry.raw = raw
    t = time.perf_counter()
    telemetry.__exit__(None, None, None)
    figures["telemetry_stop_s"] = time.perf_counter() - t
    out = Outcome(status="ok", metrics=worker.metrics_from(raw, config, 0.0), telemetry=telemetry.block,
                  model=dict(native.facts), runtime=trainer.describe())
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        write_json_atomic(Path(tmp) / "result.json", out.outcome_json())
        if telemetry.timeline is not None:
            write_json_atomic(Path(tmp) / "timeline.json", telemetry.timeline)
        figures["result_write_s"] = time.perf_counter() - t
    trainer.close()
    return figures


if __name__ == "__main__":
    found = main(sys.argv[1])
    MARKS.append(time.time())
    print(json.dumps({**found, "marks": MARKS}), flush=True)
