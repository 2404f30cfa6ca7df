"""A profile trace reduced to why a config is slow (gpubench.measure.trace): the figures of a
scripted GPU trace, the host side of a CPU one, and each one-line reading from scripted figures."""

from __future__ import annotations

import pytest

from gpubench.measure.trace import reading, trace_breakdown


def kernel(ts, dur, corr, name="void gemm"):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7,
            "args": {"correlation": corr}}


def launch(ts, corr, dur=3):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": {"correlation": corr}}


def test_a_gpu_trace_splits_device_time_and_idle_by_cause():
    # device span 0..100 us: compute 0-40 and 70-90 (a kernel of 5 us among them), NCCL 40-50
    # overlapping a copy 45-55 (the overlap counts as communication), idle 55-70 and 90-95
    # (then a copy at 95-100). The kernel at 70 was launched at 60, after its gap began at 55:
    # host wait; the copy at 95 was asked for at 20: other
    events = [
        launch(-10, 1), kernel(0, 35, 1), launch(-5, 2), kernel(35, 5, 2),
        launch(-2, 3), kernel(40, 10, 3, name="ncclKernel_AllReduce"),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 45, "dur": 10, "args": {"correlation": 4}},
        launch(-1, 4),
        launch(60, 5), kernel(70, 20, 5),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 95, "dur": 5, "args": {"correlation": 6}},
        launch(20, 6),
        {"ph": "i", "name": "an instant event, not a complete one", "ts": 1},
    ]
    d = trace_breakdown({"traceEvents": events})["device"]
    assert d["span_ms"] == pytest.approx(0.1)
    assert (d["compute_share"], d["communication_share"], d["memory_share"]) == pytest.approx((0.6, 0.1, 0.1))
    assert d["idle_share"] == pytest.approx(0.2)
    assert (d["idle_host_wait_share"], d["idle_other_share"]) == pytest.approx((0.15, 0.05))
    assert (d["kernels"], d["short_kernels"]) == (4, 1) and d["short_kernel_share"] == pytest.approx(0.25)
    assert d["short_kernel_time_share"] == pytest.approx(5 / 70)
    # launch to start: 10, 40, 42, 10 us
    assert d["launch_latency_median_us"] == pytest.approx(25.0)


def test_a_cpu_trace_gives_the_host_side():
    ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 0, "dur": 60, "pid": 1, "tid": 1},
           {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 5, "dur": 50, "pid": 1, "tid": 1},  # inside
           {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "ts": 70, "dur": 4, "pid": 1, "tid": 1},
           {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 80, "dur": 20, "pid": 1, "tid": 1},
           {"ph": "X", "cat": "cpu_op", "name": "other thread", "ts": 0, "dur": 3, "pid": 1, "tid": 2},
           # the profiler's step range covers the thread: it must not hide the gaps between operators
           {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "ts": 0, "dur": 100, "pid": 1, "tid": 1}]
    figures = trace_breakdown({"traceEvents": ops})
    h = figures["host"]
    assert figures["device"] is None
    assert (h["ops"], h["short_ops"]) == (3, 1) and h["idle_share"] == pytest.approx(0.16)
    assert h["short_op_time_share"] == pytest.approx(4 / 84)
    assert reading(figures).startswith("compute-bound on the CPU: operators run 84% of the profiled span;")
    # a rank of a distributed config: gloo's ranges (on its own thread) are the collectives' share,
    # clipped to the main thread's span and counted once where they overlap
    gloo = [{"ph": "X", "cat": "user_annotation", "name": "gloo:all_gather", "ts": 10, "dur": 20, "pid": 1, "tid": 3},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 25, "dur": 10, "pid": 1, "tid": 4},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 95, "dur": 30, "pid": 1, "tid": 3}]
    ranked = trace_breakdown({"traceEvents": ops + gloo})
    assert ranked["host"]["communication_share"] == pytest.approx((25 + 5) / 100)
    assert reading(ranked).startswith("communication-bound: collectives take 30% of the profiled span")
    assert figures["host"]["communication_share"] == 0.0


DEVICE = {"span_ms": 10.0, "compute_share": 0.5, "communication_share": 0.0, "memory_share": 0.0,
          "idle_share": 0.1, "idle_host_wait_share": 0.05, "idle_other_share": 0.05, "kernels": 100,
          "short_kernels": 10, "short_kernel_share": 0.1, "short_kernel_time_share": 0.02,
          "launch_latency_median_us": 12.0, "short_us": 10.0}


@pytest.mark.parametrize("figures, expected", [
    ({"idle_share": 0.48, "idle_host_wait_share": 0.4, "idle_other_share": 0.08},
     "launch-bound: the GPU is idle 48% of the span, 40% waiting for the host to launch work; CUDA graphs or "
     "torch.compile remove launches, a larger batch gives each launch more work"),
    ({"short_kernel_share": 0.8, "short_kernel_time_share": 0.35},
     "many small kernels: 80% of 100 kernels run under 10 us and take 35% of kernel time; fusion (torch.compile, "
     "XLA) or a larger batch gives the GPU longer work"),
    ({"communication_share": 0.4}, "communication-bound: collectives take 40% of the device span; a larger batch per "
                                   "device, or overlapping them with the backward pass, hides them"),
    ({"memory_share": 0.25}, "copy-bound: memory copies take 25% of the device span; keep the data on the device "
                             "(data = device) or pin the host memory it comes from"),
    ({"idle_share": 0.4, "idle_host_wait_share": 0.1, "idle_other_share": 0.3},
     "the GPU is idle 40% of the span, mostly waiting on work already asked for (synchronisation, dependencies), not "
     "on launches"),
    ({"compute_share": 0.9}, "compute-bound: kernels run 90% of the device span; faster kernels (tf32 or bf16, "
                             "channels-last, fused attention) are what is left"),
    ({}, "no single limit: compute 50%, communication 0%, copies 0%, idle 10% of the device span"),
])
def test_each_reading_follows_from_its_figures(figures, expected):
    assert reading({"device": {**DEVICE, **figures}, "host": None}) == expected


@pytest.mark.parametrize("host, expected", [
    ({"short_op_time_share": 0.4, "short_op_share": 0.9},
     "host-bound on small operators: 90% of the 500 top-level operators run under 10 us and take 40% of operator "
     "time; a larger batch or a compiled step (torch.compile, XLA) does more work per operator"),
    ({"communication_share": 0.12},
     "compute-bound on the CPU: operators run 95% of the profiled span (collectives 12% of it); faster kernels (bf16 "
     "where the CPU has it, more threads) are what is left"),
    ({"idle_share": 0.35, "busy_share": 0.65},
     "the host is idle 35% of the profiled span between operators (Python, the input pipeline, waiting): "
     "device-resident data or a compiled step shortens it"),
])
def test_each_host_reading_follows_from_its_figures(host, expected):
    base = {"span_ms": 5.0, "busy_share": 0.95, "idle_share": 0.05, "ops": 500, "short_ops": 50,
            "short_op_share": 0.1, "short_op_time_share": 0.01, "short_us": 10.0}
    assert reading({"device": None, "host": {**base, **host}}) == expected
    assert reading({"device": None, "host": None}).startswith("no reading")


def test_interval_subtraction_matches_a_grid_count():
    """_minus in one pass over both lists gives what counting a fine grid does."""
    import random

    from gpubench.measure.trace import _length, _minus, _union

    rng = random.Random(0)
    for _ in range(200):
        a = _union([(x, x + rng.randint(1, 20)) for x in (rng.randint(0, 200) for _ in range(rng.randint(0, 12)))])
        b = _union([(x, x + rng.randint(1, 20)) for x in (rng.randint(0, 200) for _ in range(rng.randint(0, 12)))])
        grid = sum(1 for t in range(0, 230) if any(x <= t < y for x, y in a) and not any(x <= t < y for x, y in b))
        assert _length(_minus(a, b)) == grid


def test_a_cpu_reading_weighs_threads_against_the_cores_left():
    """An oversubscribed config (more threads than the cores other processes left it) is read as
    such, never told to add threads; more threads are suggested only where cores were free."""
    host = {"span_ms": 5.0, "busy_share": 0.9, "idle_share": 0.1, "ops": 500, "short_ops": 5,
            "short_op_share": 0.01, "short_op_time_share": 0.01, "short_us": 10.0}
    figures = {"device": None, "host": host}
    busy = reading(figures, {"threads": 2, "cores": 2, "others_cores": 1.0})
    assert busy.startswith("oversubscribed: 2 threads on 2 cores, other processes using 1.0 of them")
    assert "fewer threads (threads = 1)" in busy and "more threads" not in busy
    assert reading(figures, {"threads": 16, "cores": 8, "others_cores": None}).startswith(
        "oversubscribed: 16 threads on 8 cores, so threads wait")
    full = reading(figures, {"threads": 2, "cores": 2, "others_cores": 0.1})
    assert full.startswith("compute-bound on the CPU") and "more threads" not in full
    room = reading(figures, {"threads": 2, "cores": 8, "others_cores": 0.0})
    assert "more threads (2 of 8 cores in use)" in room
