"""Memory timelines: the allocator snapshot's reduction (scripted snapshots in PyTorch's shape),
``gpubench profile --memory-history`` end to end through the fake backend's scripted
allocator, the oom figures, the report's links, and the torch backend's refusal on a CPU."""

from __future__ import annotations

import pickle

import pytest

from gpubench.measure.allocations import at_oom, history_facts, history_line, largest_allocations, oom_line
from tests.conftest import fake_suite, plugin_env, result_lines, run_cli

USER = {"filename": "/home/me/model.py", "line": 12, "name": "forward"}
CPP = {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"}
TORCH = {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"}


def snapshot(history: bool = True) -> dict:
    frames = [CPP, TORCH, USER] if history else []
    blocks = [{"size": 4 << 20, "requested_size": 4_000_000, "address": 0, "state": "active_allocated",
               "frames": frames},
              {"size": 16 << 20, "requested_size": 16 << 20, "address": 1, "state": "active_allocated",
               "frames": frames},
              {"size": 64 << 20, "requested_size": 64 << 20, "address": 2, "state": "inactive", "frames": []},
              {"size": 1 << 20, "requested_size": 1 << 20, "address": 3, "state": "active_awaiting_free",
               "frames": []}]
    trace = [{"action": "alloc", "addr": 0, "size": 4 << 20},
             {"action": "alloc", "addr": 9, "size": 32 << 20},  # a temporary: the peak
             {"action": "free_requested", "addr": 9, "size": 32 << 20},
             {"action": "free_completed", "addr": 9, "size": 32 << 20},
             {"action": "alloc", "addr": 1, "size": 16 << 20},
             {"action": "oom", "size": 1 << 30, "device_free": 3 << 20}]
    return {"segments": [{"address": 0, "total_size": 128 << 20, "allocated_size": 21 << 20, "blocks": blocks}],
            "device_traces": [trace] if history else [[]]}


def test_largest_live_allocations_first_with_the_users_frame():
    rows = largest_allocations(snapshot())
    assert [r["bytes"] for r in rows] == [16 << 20, 4 << 20, 1 << 20]  # the inactive 64 MiB is cached, not live
    assert rows[1]["requested_bytes"] == 4_000_000
    assert rows[0]["where"] == "/home/me/model.py:12 forward"  # past a C++ frame and torch's own
    assert largest_allocations(snapshot(), n=1) == rows[:1]
    assert [r["where"] for r in largest_allocations(snapshot(history=False))] == ["", "", ""]


def test_at_oom_names_the_request_and_what_was_free():
    oom = at_oom(snapshot())
    assert (oom["requested_bytes"], oom["device_free_bytes"]) == (1 << 30, 3 << 20)
    assert (oom["reserved_bytes"], oom["allocated_bytes"], oom["live_blocks"]) == (128 << 20, 21 << 20, 3)
    line = oom_line(oom)
    assert line.startswith("at the failure: asked for 1.0 GiB with 3.0 MiB free; 21.0 MiB allocated of 128.0 MiB")
    assert "largest live: 16.0 MiB (/home/me/model.py:12 forward)" in line
    no_history = at_oom(snapshot(history=False))  # sizes still, no request
    assert no_history["requested_bytes"] is None and no_history["allocated_bytes"] == 21 << 20
    assert "asked for" not in oom_line(no_history)


def test_history_peak_is_replayed_from_what_was_live_at_its_start():
    facts = history_facts(snapshot())
    # the history's actions carry the sizes asked for: live now, asked for, 16 MiB + 4,000,000 B +
    # 1 MiB (a block awaiting its free is live); the history's net is +20 MiB, so the rest was
    # live before it; the temporary 32 MiB on top of that and the 4 MiB block is the peak
    before = (16 << 20) + 4_000_000 + (1 << 20) - (20 << 20)
    assert facts["peak_allocated_bytes"] == before + (36 << 20)
    assert facts["entries"] == 6
    assert history_facts(snapshot(history=False))["peak_allocated_bytes"] is None
    assert history_line({"file": None, "reason": "why not"}) == "no memory history: why not"


def test_torch_on_a_cpu_config_says_why_it_records_nothing():
    pytest.importorskip("torch")
    from gpubench.backends.pytorch.backend import TorchBackend
    from gpubench.config import Config

    config = Config(framework="torch", workload="mlp", device="cpu")
    assert "a CPU config has none" in TorchBackend().memory_history_problem(config)
    assert TorchBackend().allocator_snapshot(config) is None


def test_profile_memory_history_writes_the_snapshot_and_the_oom_figures(tmp_path):
    (tmp_path / "s.toml").write_text(fake_suite("mem", matrix="mode = [0, 3]"))
    proc = run_cli(["profile", "s.toml", "--out", "runs", "--memory-history", "--steps", "2"], cwd=tmp_path,
                   env=plugin_env(FAKE_ALLOCATOR="1"))
    out = proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    by_mode = {r["config"]["workload_params"]["mode"]: r for r in result_lines(run_dir)}
    ok, oom = by_mode[0], by_mode[3]
    assert oom["status"] == "oom"
    history = ok["profile"]["memory_history"]
    snap = pickle.loads((run_dir / history["file"]).read_bytes())
    assert history["file"].endswith("memory_snapshot.pickle") and snap["segments"][0]["blocks"]
    assert history["entries"] == 2 and history["largest"][0]["where"].endswith(" build")
    assert ok["runtime"]["memory_history"]["recorded"] is True
    assert (f"fault_mode0-fake-cpu-bs8-fp32-single: memory history: runs/{run_dir.name}/{history['file']} "
            "(2 allocator actions") in out.replace("\n", " ")
    at = oom["metrics"]["oom"]
    assert (at["requested_bytes"], at["device_free_bytes"]) == (1 << 30, 1 << 20)
    assert (run_dir / at["snapshot"]).is_file()
    assert "at the failure: asked for 1.0 GiB with 1.0 MiB free" in out
    html = (tmp_path / "reports" / run_dir.name / "index.html").read_text()
    assert 'id="profiles"' in html and "memory_snapshot.pickle" in html
    # the links lead to the files from the report's directory
    assert f'href="../../runs/{run_dir.name}/{history["file"]}"' in html


def test_profile_memory_history_on_a_framework_without_one_says_why(tmp_path):
    (tmp_path / "s.toml").write_text(fake_suite("mem"))
    proc = run_cli(["profile", "s.toml", "--out", "runs", "--memory-history", "--steps", "2", "--no-report"],
                   cwd=tmp_path)
    (run_dir,) = list((tmp_path / "runs").iterdir())
    (r,) = result_lines(run_dir)
    assert r["profile"]["memory_history"] == {
        "file": None, "reason": "the fake backend records no allocator history (PyTorch's CUDA caching allocator "
                                "has one: framework = torch, device = cuda)"}
    assert r["runtime"]["memory_history"]["recorded"] is False
    assert "no memory history: the fake backend records no allocator history" in proc.stdout.replace("\n", " ")
