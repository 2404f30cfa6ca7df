"""gpubench profile: traces, operator tables, NVTX-style ranges, the where-time-goes breakdown
(its arithmetic, its phases training like the real step), failures reported in one line."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from gpubench.backends.base import ProfilingUnavailable, Trainer
from gpubench.measure.breakdown import measure_breakdown
from gpubench.measure.loop import run_loop
from gpubench.measure.timers import HostStepTimer
from tests.conftest import plain_env, result_lines, run_cli

TINY = """
name = "tiny"
[defaults]
warmup_steps = 1
steps = 3
windows = 2
timeout_s = 300
optimizer = "sgd"
lr = 0.05
workload = "mlp"
depth = 1
width = 64
batch_size = 32
[matrix]
framework = ["torch", "tensorflow"]
"""


# --- the breakdown's arithmetic and the loop's ranges, without a framework ----------------------

class ScriptedClock:
    """Laps of known lengths, in order."""

    timing = "scripted"

    def __init__(self, laps: list[float]) -> None:
        self.laps = laps
        self.i = 0

    def start(self) -> None:
        pass

    def lap(self) -> float:
        self.i += 1
        return self.laps[(self.i - 1) % len(self.laps)]


class PhasedTrainer(Trainer):
    def __init__(self, phases: list[str], laps: list[float]) -> None:
        self.phases, self.clock, self.steps = phases, ScriptedClock(laps), 0

    def step(self) -> None:
        self.steps += 1

    def phased_step(self, lap) -> None:
        self.steps += 1
        for p in self.phases:
            lap(p)

    def phase_clock(self):
        return self.clock

    def sync(self) -> None:
        pass

    def read_losses(self) -> list[float]:
        return [1.0 / (1 + self.steps)]

    def step_timer(self, n_steps: int) -> HostStepTimer:
        return HostStepTimer(n_steps)

    def memory(self) -> dict[str, int]:
        return {}


def test_breakdown_idle_and_overlap_against_the_measured_step():
    trainer = PhasedTrainer(["data", "forward", "backward", "optimizer"], [1.0, 2.0, 3.0, 4.0])
    b, why = measure_breakdown(trainer, steps=3, step_ms=12.5)
    assert why == "" and trainer.steps == 4  # one untimed step first, then three timed
    assert (b["data_ms"], b["forward_ms"], b["backward_ms"], b["optimizer_ms"]) == (1.0, 2.0, 3.0, 4.0)
    assert b["phases_ms"] == 10.0 and b["step_ms"] == 12.5
    assert b["idle_ms"] == 2.5 and b["overlap_ms"] == 0.0
    assert b["timing"] == "scripted" and "3 steps" in b["method"]
    b, _ = measure_breakdown(PhasedTrainer(["data", "forward", "backward", "optimizer"], [1.0, 2.0, 3.0, 4.0]),
                             steps=2, step_ms=8.0)
    assert b["idle_ms"] == 0.0 and b["overlap_ms"] == 2.0


def test_instrumented_phases_are_each_steps_sum_not_the_sum_of_medians():
    # step 1: 1 + 9, step 2: 9 + 1, step 3: 1 + 1 -> per-step sums 10, 10, 2 (median 10), while
    # the phases' own medians are 1 and 1 (phases_ms 2)
    trainer = PhasedTrainer(["data", "forward"], [1.0, 9.0, 9.0, 1.0, 1.0, 1.0])
    b, _ = measure_breakdown(trainer, steps=3, step_ms=None)
    assert b["phases_ms"] == 2.0 and b["instrumented_phases_ms"] == 10.0


def test_breakdown_backward_by_difference_and_unavailable():
    # TensorFlow's way: forward alone (2 ms), then forward + backward together (7 ms)
    trainer = PhasedTrainer(["data", "forward", "forward_backward", "optimizer"], [1.0, 2.0, 7.0, 4.0])
    b, _ = measure_breakdown(trainer, steps=2, step_ms=20.0)
    assert b["backward_ms"] == 5.0 and b["phases_ms"] == 12.0 and b["idle_ms"] == 8.0
    assert "forward-only" in b["method"]

    class Whole(PhasedTrainer):
        def phased_step(self, lap) -> None:
            raise ProfilingUnavailable("one graph")

    assert measure_breakdown(Whole([], [1.0]), steps=2, step_ms=1.0) == (None, "one graph")


def test_ranges_mark_every_phase_and_step():
    marks: list[str] = []

    class Recorder:
        def push(self, name: str) -> None:
            marks.append(f"+{name}")

        def pop(self) -> None:
            marks.append("-")

    raw = run_loop(PhasedTrainer([], [1.0]), warmup_steps=2, steps=2, windows=2, ranges=Recorder())
    assert len(raw.step_times_ms) == 4
    assert marks == ["+cold start", "-", "+warmup", "+step 0", "-", "+step 1", "-", "-",
                     "+window 0", "+step 2", "-", "+step 3", "-", "-", "+window 1", "+step 4", "-", "+step 5", "-", "-"]


# --- through the CLI, with both frameworks -------------------------------------------------------

@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    tmp = tmp_path_factory.mktemp("profile")
    (tmp / "tiny.toml").write_text(TINY)
    proc = run_cli(["profile", "tiny.toml", "--out", "runs", "--steps", "3"], cwd=tmp, env=plain_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp / "runs").iterdir())
    return tmp, run_dir, proc, {r["config"]["framework"]: r for r in result_lines(run_dir)}


@pytest.mark.slow
def test_profile_writes_traces_and_operator_tables(profiled):
    _, run_dir, proc, results = profiled
    assert "Traceback" not in proc.stdout + proc.stderr
    expected_op = {"torch": "aten::addmm", "tensorflow": "MatMul"}
    for framework, r in results.items():
        assert r["status"] == "ok"
        p = r["profile"]
        assert p["dir"].startswith("profile/") and p["steps"] == 3
        trace = json.loads((run_dir / p["files"]["trace"]).read_text())
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        assert len(events) > 10
        names = [o["name"] for o in p["top_cpu"]]
        assert any(expected_op[framework] in n for n in names), names
        assert all(o["self_ms"] > 0 and o["calls"] >= 1 for o in p["top_cpu"])
        assert p["top_device"] == []  # a CPU config has no device trace
        md = (run_dir / p["files"]["top_ops_md"]).read_text()
        assert "Top operators by self time on the CPU" in md and expected_op[framework] in md
        rows = json.loads((run_dir / p["files"]["top_ops_json"]).read_text())
        assert {"name", "calls", "self_cpu_ms", "self_device_ms"} <= set(rows[0])
        assert f"{run_dir.name}/{p['files']['trace']}" in proc.stdout  # paths printed at the end
    assert "aten::addmm" in proc.stdout
    # TensorBoard's profile plugin: <logdir>/plugins/profile/<session>/<host>.xplane.pb
    logdir = run_dir / results["tensorflow"]["profile"]["files"]["logdir"]
    assert logdir.name == "tf" and list(logdir.glob("plugins/profile/*/*.xplane.pb"))
    assert "torch.profiler" in results["torch"]["profile"]["profiler"]


@pytest.mark.slow
def test_the_torch_trace_carries_steps_and_rank_where_hta_and_tensorboard_look(profiled):
    """A directory holding the trace alone (HTA reads every .json in trace_dir), named
    ``*.pt.trace.json`` (TensorBoard's PyTorch profiler plugin), with a ``ProfilerStep#<i>`` range
    per profiled step and a ``distributedInfo`` block (HTA takes the rank from it)."""
    _, run_dir, _, results = profiled
    p = results["torch"]["profile"]
    assert p["files"]["trace"] == f"{p['dir']}/torch/rank0.pt.trace.json"
    trace_path = run_dir / p["files"]["trace"]
    assert [f.name for f in trace_path.parent.iterdir()] == ["rank0.pt.trace.json"]
    trace = json.loads(trace_path.read_text())
    assert trace["distributedInfo"] == {"rank": 0, "world_size": 1}
    steps = [e for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    assert sorted(e["name"] for e in steps) == [f"ProfilerStep#{i}" for i in range(p["steps"])]
    assert all(e["dur"] > 0 for e in steps)
    # every training step is inside its range: one optimizer step each
    optimizer = [e for e in trace["traceEvents"] if e.get("name", "").startswith("Optimizer.step#")]
    assert len(optimizer) == p["steps"]
    assert all(any(s["ts"] <= o["ts"] < s["ts"] + s["dur"] for s in steps) for o in optimizer)
    # the operator tables leave the step ranges out
    assert not any(o["name"].startswith("ProfilerStep") for o in p["top_cpu"])


# HTA 0.5 calls pandas methods with inplace=True, which pandas 3.1 deprecates (its warning, not ours)
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The inplace keyword")
def test_hta_finds_the_profiled_iterations_and_rank_0(profiled):
    """Holistic Trace Analysis, the real client, on the trace directory gpubench wrote."""
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    _, run_dir, _, results = profiled
    p = results["torch"]["profile"]
    trace_dir = str((run_dir / p["files"]["trace"]).parent)
    analysis = TraceAnalysis(trace_dir=trace_dir, include_last_profiler_step=True)
    assert list(analysis.t.traces) == [0]
    assert analysis.t.meta_data[0]["distributedInfo"]["world_size"] == 1
    assert [int(s) for s in analysis.get_profiler_steps()] == list(range(p["steps"]))
    # by default HTA leaves the last step out (its GPU kernels may run past the trace's end)
    default = TraceAnalysis(trace_dir=trace_dir)
    assert [int(s) for s in default.get_profiler_steps()] == list(range(p["steps"] - 1))


@pytest.mark.slow
def test_profile_breakdown_sums_sensibly(profiled):
    _, _, _, results = profiled
    for framework, r in results.items():
        m = r["metrics"]
        b = m["breakdown"]
        assert b is not None, m.get("breakdown_reason")
        assert b["forward_ms"] > 0 and b["optimizer_ms"] > 0 and b["data_ms"] >= 0
        assert b["backward_ms"] > 0 if framework == "torch" else b["backward_ms"] >= 0
        parts = b["data_ms"] + b["forward_ms"] + b["backward_ms"] + b["optimizer_ms"]
        assert b["phases_ms"] == pytest.approx(parts)
        assert b["step_ms"] == pytest.approx(statistics.median(m["step_times_ms"]))
        assert b["idle_ms"] >= 0 and b["overlap_ms"] >= 0 and min(b["idle_ms"], b["overlap_ms"]) == 0
        assert b["idle_ms"] - b["overlap_ms"] == pytest.approx(b["step_ms"] - b["phases_ms"])
        # each instrumented step's wall time encloses its phases, so the medians over the steps
        # keep that order (the sum of the phases' own medians, parts, need not: 3 noisy steps)
        assert b["instrumented_step_ms"] >= b["instrumented_phases_ms"] * 0.99
        assert b["steps"] == 3 and b["timing"] == "host_clock"
    assert "forward-only" in results["tensorflow"]["metrics"]["breakdown"]["method"]


@pytest.mark.slow
def test_profile_report_shows_the_breakdown(profiled):
    tmp, run_dir, proc, results = profiled
    report = tmp / "reports" / run_dir.name
    html = (report / "index.html").read_text()
    assert "Where time goes" in html and 'data-file="breakdown.png"' in html
    assert (report / "charts" / "breakdown.png").stat().st_size > 1000
    md = (report / "summary.md").read_text()
    section = md.split("### Where time goes")[1]
    assert all(r["config_id"] in section for r in results.values())
    csv = (report / "results.csv").read_text().splitlines()
    assert "breakdown_forward_ms" in csv[0]


def test_profile_failures_are_one_line_each(tmp_path, write_suite):
    """A config that errors, one that is unavailable, one whose backend has no profiler: one
    line each (the error with its log), exit 1, no traceback; bad input: exit 2, nothing written."""
    suite = write_suite("""
name = "faults"
[defaults]
framework = "fake"
workload = "fault"
warmup_steps = 0
steps = 2
windows = 1
[matrix]
mode = [0, 1]
device = ["cpu", "cuda"]
""")
    proc = run_cli(["profile", str(suite), "--out", "runs", "--no-report"], cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    lines = out.replace("\n", " ")
    assert "fault_mode1-fake-cpu-bs64-fp32-single: error: ValueError: injected failure in build (log:" in lines
    assert "fault_mode0-fake-cuda-bs64-fp32-single: unavailable: no cuda device here" in lines
    assert "fault_mode0-fake-cpu-bs64-fp32-single: not profiled: FakeTrainer has no profiler" in lines
    (run_dir,) = list((tmp_path / "runs").iterdir())
    ok = next(r for r in result_lines(run_dir) if r["status"] == "ok")
    assert ok["metrics"]["breakdown"] is None
    assert ok["metrics"]["breakdown_reason"] == "FakeTrainer does not split its step into phases"

    bad = run_cli(["profile", str(suite), "--out", "runs2", "--set", "compile=jit"], cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "unknown compile 'jit'" in bad.stderr
    assert not (tmp_path / "runs2").exists()


@pytest.mark.slow
def test_profile_of_a_pipeline_config_profiles_rank_0_and_ends(tmp_path):
    """Every stage takes the profiled steps (they exchange activations), so rank 0's profiler
    pass cannot leave the other stages waiting until the timeout."""
    pytest.importorskip("torch")
    text = TINY.replace('framework = ["torch", "tensorflow"]', 'framework = ["torch"]\nparallelism = ["pipeline:2"]')
    (tmp_path / "pipe.toml").write_text(text.replace("timeout_s = 300", "timeout_s = 120")
                                        .replace("batch_size = 32", "batch_size = 32\npipeline_microbatches = 2"))
    proc = run_cli(["profile", "pipe.toml", "--out", "runs", "--steps", "2", "--no-report"], cwd=tmp_path,
                   env=plain_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    (result,) = result_lines(run_dir)
    assert result["status"] == "ok", result["reason"]
    assert result["profile"]["steps"] == 2 and (run_dir / result["profile"]["files"]["trace"]).is_file()
    trace = json.loads((run_dir / result["profile"]["files"]["trace"]).read_text())
    # torch.profiler's own block where torch.distributed is initialised
    assert {k: trace["distributedInfo"][k] for k in ("backend", "rank", "world_size")} == {
        "backend": "gloo", "rank": 0, "world_size": 2}
    assert result["profile"]["files"]["trace"].endswith("/torch/rank0.pt.trace.json")
    assert sum(e.get("name") in ("ProfilerStep#0", "ProfilerStep#1") for e in trace["traceEvents"]) == 2
    assert result["metrics"]["breakdown"] is None and result["metrics"]["breakdown_reason"]


def test_tensorflow_phased_steps_train_like_the_real_step():
    """The breakdown pass's separate functions make the same update as the one-function step."""
    pytest.importorskip("tensorflow")
    from gpubench.backends import get_backend
    from gpubench.suite import Config
    from gpubench.workloads import get_workload
    from gpubench.workloads.data import synthetic_batches

    spec = get_workload("mlp").spec(depth=1, width=16)
    config = Config(workload="mlp", framework="tensorflow", batch_size=8, optimizer="sgd", lr=0.05,
                    parallelism="grad-accum:2", workload_params=(("depth", 1), ("width", 16)))

    def losses(phased: bool) -> list[float]:
        trainer = get_backend("tensorflow").build(spec, config, synthetic_batches(spec, 8, 6, seed=0))
        out = []
        for _ in range(4):
            trainer.phased_step(lambda phase: None) if phased else trainer.step()
            out.append(trainer.read_loss())
        return out

    np.testing.assert_allclose(losses(True), losses(False), rtol=1e-5)


@pytest.mark.gpu
def test_profile_on_cuda_has_device_ops_and_event_timing(tmp_path, write_suite):
    suite = write_suite(TINY.replace('framework = ["torch", "tensorflow"]', 'framework = ["torch"]\n'
                                     'device = ["cuda"]\ncompile = ["none", "cuda-graph"]'))
    proc = run_cli(["profile", str(suite), "--out", "runs", "--steps", "5"], cwd=tmp_path, env=plain_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list(Path(tmp_path / "runs").iterdir())
    results = {r["config"]["compile"]: r for r in result_lines(run_dir)}
    eager, graph = results["none"], results["cuda-graph"]
    for r in (eager, graph):
        assert r["status"] == "ok" and r["profile"]["top_device"], r["config_id"]
        assert all(o["self_ms"] > 0 for o in r["profile"]["top_device"])
        trace = json.loads((run_dir / r["profile"]["files"]["trace"]).read_text())
        assert trace["distributedInfo"] == {"rank": 0, "world_size": 1}
        steps = {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
        assert steps == {f"ProfilerStep#{i}" for i in range(5)}
    b = eager["metrics"]["breakdown"]
    assert b["timing"] == "cuda_events" and b["forward_ms"] > 0 and b["backward_ms"] > 0 and b["optimizer_ms"] > 0
    assert graph["metrics"]["breakdown"] is None and "one CUDA graph" in graph["metrics"]["breakdown_reason"]


def test_gpu_time_is_counted_once_per_kernel():
    # torch.profiler gives a host operator the device time of the kernels it launched, and each
    # kernel a row of its own: only the kernel rows carry device time, so the table adds up
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from gpubench.backends.pytorch.profiling import op_rows
    from gpubench.measure.ops import tables

    def event(key, device_type, self_cpu, self_dev, annotation=False):
        return SimpleNamespace(key=key, count=10, self_cpu_time_total=self_cpu, cpu_time_total=self_cpu,
                               self_device_time_total=self_dev, device_type=device_type,
                               is_user_annotation=annotation)

    events = [event("aten::addmm", DeviceType.CPU, 500.0, 3000.0), event("sm90_gemm_bf16", DeviceType.CUDA, 0.0, 3000.0),
              event("aten::relu", DeviceType.CPU, 80.0, 200.0), event("vectorized_relu", DeviceType.CUDA, 0.0, 200.0),
              event("ProfilerStep#0", DeviceType.CUDA, 0.0, 3300.0, annotation=True),
              event("annotated", DeviceType.CUDA, 0.0, 3200.0, annotation=True)]
    rows = op_rows(events, cuda=True)
    assert sum(r.self_device_ms or 0.0 for r in rows) == pytest.approx(3.2)  # the two kernels' 3.2 ms
    t = tables(rows)
    assert [r.name for r in t["device"]] == ["sm90_gemm_bf16", "vectorized_relu"]
    assert [r.name for r in t["cpu"]] == ["aten::addmm", "aten::relu"]
    assert all(r.self_device_ms is None for r in op_rows(events, cuda=False))


def test_cupti_is_set_up_before_a_cuda_trainer_is_built_for_profiling(monkeypatch):
    import torch.profiler._utils as profiler_utils

    from gpubench.backends import get_backend
    from gpubench.suite import Config

    calls = []
    monkeypatch.setattr(profiler_utils, "_init_for_cuda_graphs", lambda: calls.append(1))
    backend = get_backend("torch")
    backend.before_profiled_build(Config(workload="cnn", device="cpu"))
    assert calls == []
    backend.before_profiled_build(Config(workload="cnn", device="cuda", compile="cuda-graph"))
    assert calls == [1]


@pytest.mark.slow
def test_a_profiled_config_has_its_trace_breakdown_and_a_reading(profiled):
    """The torch trace of a CPU config gives the host side of the breakdown and a reading that
    quotes it, printed under the config; TensorFlow's trace, without torch.profiler's event
    categories, says why it has none."""
    _, _, proc, results = profiled
    p = results["torch"]["profile"]
    host = p["trace_breakdown"]["host"]
    assert p["trace_breakdown"]["device"] is None and host["ops"] > 0 and 0 <= host["idle_share"] <= 1
    assert p["reading"] and f"reading: {p['reading']}" in proc.stdout
    tf = results["tensorflow"]["profile"]
    assert tf["trace_breakdown"] is None and "no events of torch.profiler's categories" in tf["trace_breakdown_reason"]
