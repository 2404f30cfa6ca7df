"""The run directory: atomic appends, tolerant loading, clear errors."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from gpubench.errors import InputError
from gpubench.results.result import Result
from gpubench.results.schema import result_problem
from gpubench.results.store import append_result, create_run_dir, load_results, load_run, write_json_atomic


def line(i: int) -> dict:
    """The smallest line a run writes: a config decided before any worker started."""
    return {"schema_version": 1, "run_id": "r", "config_id": f"c{i}", "repeat": 0, "config": {"framework": "torch"},
            "status": "unavailable", "reason": "no such device", "metrics": None}


def result(i: int, **change) -> Result:
    return Result.from_json({**line(i), **change})


MEASURED = {"throughput": {"median": 100.0, "ci_low": 90.0, "ci_high": 110.0},
            "step_time_ms": {"median": 10.0, "cv": 0.02}, "cold_start_ms": 30.0, "samples_per_step": 8}


def test_append_and_load_round_trip(tmp_path):
    for i in range(3):
        append_result(tmp_path, result(i))
    assert [r.config_id for r in load_results(tmp_path)] == ["c0", "c1", "c2"]
    assert load_results(tmp_path / "missing-but-fine") == []


def test_short_writes_are_continued_and_a_failed_append_is_undone(tmp_path, monkeypatch):
    import errno
    import os

    real_write = os.write
    append_result(tmp_path, result(0))
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:10]))  # 10 bytes a call
    append_result(tmp_path, result(1))
    assert [r.config_id for r in load_results(tmp_path)] == ["c0", "c1"]

    calls = []
    def disk_full(fd, data):  # half the line, then no more room
        calls.append(len(data))
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data[: len(data) // 2])
    monkeypatch.setattr(os, "write", disk_full)
    before = (tmp_path / "results.jsonl").read_bytes()
    with pytest.raises(InputError, match=r"results\.jsonl: could not append a result: No space left on device; the "
                                         r"result is not recorded and the part written was removed$"):
        append_result(tmp_path, result(2))
    assert (tmp_path / "results.jsonl").read_bytes() == before  # whole lines only
    monkeypatch.setattr(os, "write", real_write)
    append_result(tmp_path, result(3))
    assert [r.config_id for r in load_results(tmp_path)] == ["c0", "c1", "c3"]


def test_ctrl_c_while_a_whole_line_is_synced_keeps_it_and_midway_removes_it(tmp_path, monkeypatch):
    """Ctrl-C (KeyboardInterrupt) during the fsync after a whole line was written: the line is
    kept (a reader may have seen it: nothing it saw is taken back); during the write itself:
    the part written is removed."""
    import os

    real_fsync, real_write = os.fsync, os.write
    append_result(tmp_path, result(0))

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        append_result(tmp_path, result(1))
    assert [r.config_id for r in load_results(tmp_path)] == ["c0", "c1"]
    monkeypatch.setattr(os, "fsync", real_fsync)
    calls = []

    def half_then_interrupted(fd, data):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real_write(fd, data[: len(data) // 2])
    monkeypatch.setattr(os, "write", half_then_interrupted)
    before = (tmp_path / "results.jsonl").read_bytes()
    with pytest.raises(KeyboardInterrupt):
        append_result(tmp_path, result(2))
    assert (tmp_path / "results.jsonl").read_bytes() == before


def test_no_append_after_a_half_written_line(tmp_path):
    append_result(tmp_path, result(0))
    path = tmp_path / "results.jsonl"
    with open(path, "a") as f:
        f.write('{"schema_version": 1, "config_id": "c1", "sta')
    before = path.read_bytes()
    with pytest.raises(InputError, match=r"results\.jsonl: ends with a half-written line .* run --resume cuts it off"):
        append_result(tmp_path, result(2))
    assert path.read_bytes() == before


def test_non_finite_floats_are_written_as_null(tmp_path):
    append_result(tmp_path, result(0, loss=math.nan, x=[math.inf, 1.0]))
    raw = (tmp_path / "results.jsonl").read_text()
    assert "NaN" not in raw and "Infinity" not in raw
    assert load_results(tmp_path)[0].extra == {"loss": None, "x": [None, 1.0]}  # unknown keys are kept


def test_truncated_last_line_is_skipped_with_a_warning_and_repaired(tmp_path):
    append_result(tmp_path, result(0))
    append_result(tmp_path, result(1))
    path = tmp_path / "results.jsonl"
    with open(path, "a") as f:
        f.write('{"schema_version": 1, "config_id": "c2", "sta')
    said = []
    assert len(load_results(tmp_path, warn=said.append)) == 2
    assert len(said) == 1 and re.search(r"results\.jsonl:3: skipping a truncated last line", said[0])
    assert path.read_text().endswith('"sta')  # reading alone does not change the file
    load_results(tmp_path, repair=True, warn=said.append)
    assert len(said) == 2
    append_result(tmp_path, result(3))
    assert [r.config_id for r in load_results(tmp_path)] == ["c0", "c1", "c3"]


def test_corrupt_middle_line_and_unknown_schema_are_errors(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(line(0)) + "\n{oops\n" + json.dumps(line(2)) + "\n")
    with pytest.raises(InputError, match=r"results\.jsonl:2: corrupt result line"):
        load_results(tmp_path)
    path.write_text(json.dumps({**line(0), "schema_version": 99}) + "\n")
    with pytest.raises(InputError, match=r"results\.jsonl:1: unknown schema_version 99; this gpubench reads: 1"):
        load_results(tmp_path)


def test_results_written_by_gpubench_have_the_shape_readers_need():
    committed = sorted((Path(__file__).parent.parent / "reports" / "samples").glob("*/run"))
    fixtures = sorted((Path(__file__).parent / "fixtures").glob("run_*"))
    assert len(committed) >= 2
    for run_dir in (*committed, *fixtures):
        assert {r.status for r in load_results(run_dir)} >= {"ok"}
    node_line = {**line(0), "status": "ok", "reason": "node 1: ranks 2, 3 finished; node 0 writes the result",
                 "node_rank": 1}
    assert result_problem(node_line) is None  # node.jsonl: an ok outcome with no metrics
    assert result_problem({**line(0), "status": "oom", "metrics": {"memory": {"peak_rss_bytes": 5}}}) is None


@pytest.mark.parametrize("change, problem", [
    ({"config": None}, "'config' is null, not an object; a result line needs run_id, config_id (strings), config"),
    ({"repeat": "0"}, "'repeat' is str \"0\", not an integer"),
    ({"repeat": True}, "'repeat' is bool true, not an integer"),
    ({"status": "fast"}, "status 'fast': expected one of: ok, oom, unsupported, unavailable, diverged, target_not_reached, timeout, error"),
    ({"metrics": "x"}, "'metrics' is str \"x\", not an object or null"),
    ({"config": {"workload": "mlp"}}, "'config.framework' is null, not a string"),
    ({"status": "ok"}, "'metrics.throughput.median' is null, not a positive number; an ok result (or any with "
                       "metrics.throughput) needs numbers at: metrics.throughput.median, metrics.throughput.ci_low"),
    ({"status": "ok", "metrics": {**MEASURED, "throughput": None}}, "'metrics.throughput.median' is null"),
    ({"status": "ok", "metrics": {**MEASURED, "throughput": {**MEASURED["throughput"], "median": "fast"}}},
     "'metrics.throughput.median' is str \"fast\", not a positive number"),
    ({"status": "ok", "metrics": {**MEASURED, "step_time_ms": {"median": 0, "cv": 0.1}}},
     "'metrics.step_time_ms.median' is int 0, not a positive number"),
    ({"status": "diverged", "metrics": {**MEASURED, "cold_start_ms": None}}, "'metrics.cold_start_ms' is null"),
    ({"status": "oom", "metrics": {"memory": "lots"}}, "'metrics.memory' is str \"lots\", not an object"),
    ({"metrics": {"batch_search": {"max_batch": "64"}}}, "'metrics.batch_search.max_batch' is str \"64\""),
    ({"telemetry": {"gpu": {"energy_per_sample_j": []}}}, "'telemetry.gpu.energy_per_sample_j' is list [], not a"),
    ({"status": "ok", "metrics": {**MEASURED, "step_times_ms": "1,2"}}, "'metrics.step_times_ms' is str \"1,2\""),
])
def test_a_line_of_the_wrong_shape_is_an_error_naming_line_and_problem(tmp_path, change, problem):
    good = {**line(0), "status": "ok", "reason": "", "metrics": {**MEASURED, "step_times_ms": [9.0, None, 11.0]}}
    assert result_problem(good) is None
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**line(1), **change}) + "\n")
    with pytest.raises(InputError) as e:
        load_results(tmp_path)
    assert str(e.value).startswith(f"{path}:2: ") and problem in str(e.value)
    assert "\n" not in str(e.value)
    said = []  # the report's way: the line is skipped and said
    assert [r.config_id for r in load_results(tmp_path, strict=False, warn=said.append)] == ["c0"]
    assert len(said) == 1 and re.search(r"results\.jsonl:2: .*\(line skipped\)", said[0])


def test_a_missing_key_is_named(tmp_path):
    for key in ("run_id", "config_id", "config", "repeat", "status", "reason", "metrics"):
        (tmp_path / "results.jsonl").write_text(json.dumps({k: v for k, v in line(0).items() if k != key}) + "\n")
        with pytest.raises(InputError, match=rf"results\.jsonl:1: '{key}' missing; a result line needs run_id"):
            load_results(tmp_path)


def test_an_unreadable_results_file_is_an_error_naming_it(tmp_path):
    (tmp_path / "results.jsonl").mkdir()
    for strict in (True, False):
        with pytest.raises(InputError, match=r"results\.jsonl: not a regular file \(a FIFO, a device or a directory\)"):
            load_results(tmp_path, strict=strict)


def test_write_json_atomic_leaves_no_temporary_file(tmp_path):
    write_json_atomic(tmp_path / "run.json", {"a": 1})
    write_json_atomic(tmp_path / "run.json", {"a": 2})
    assert json.loads((tmp_path / "run.json").read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_create_run_dir_never_reuses_a_directory(tmp_path):
    a = create_run_dir(tmp_path, "quick-1")
    b = create_run_dir(tmp_path, "quick-1")
    assert (a.name, b.name) == ("quick-1", "quick-1-2")


def test_load_run_errors(tmp_path):
    with pytest.raises(InputError, match="no such run directory"):
        load_run(tmp_path / "nope")
    with pytest.raises(InputError, match=r"run\.json: missing; is .* a gpubench run directory"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text("{")
    with pytest.raises(InputError, match="unreadable run file"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text("[]")
    with pytest.raises(InputError, match=r"run\.json: not a run file: expected a JSON object \(run_id, suite, args, "
                                         r"env, \.\.\.\), got a list$"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text('{"run_id": "r", "env": "x"}')
    with pytest.raises(InputError, match=r"run\.json: 'env' is a str, not an object"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_bytes(b"\xff\xfe")
    with pytest.raises(InputError, match="unreadable run file"):
        load_run(tmp_path)


def test_one_peak_memory_for_table_report_gate_and_checkpointing():
    from gpubench.gate.compare import GATE_METRICS
    from gpubench.results.frame import flatten

    def of(memory: dict) -> Result:
        return result(0, status="oom", reason="", metrics={"memory": memory})

    gpu = of({"peak_allocated_bytes": 5, "train_peak_rss_bytes": 7, "peak_rss_bytes": 9})
    cpu = of({"peak_allocated_bytes": None, "train_peak_rss_bytes": 7, "peak_rss_bytes": 9})
    old = of({"peak_rss_bytes": 9})  # no training peak (not Linux)
    assert gpu.peak_memory() == (5, "device_allocator_peak")
    assert cpu.peak_memory() == (7, "process_peak_rss_during_training")
    assert old.peak_memory() == (9, "process_peak_rss")
    assert result(0, status="error", metrics={}).peak_memory() == (None, None)
    assert [GATE_METRICS["peak_memory"].value(r) for r in (gpu, cpu, old)] == [5, 7, 9]
    row = flatten(cpu)
    assert (row["peak_memory_bytes"], row["peak_memory_source"]) == (7, "process_peak_rss_during_training")


def test_a_result_line_survives_a_round_trip_and_keeps_keys_it_does_not_know():
    raw = {**line(0), "status": "ok", "reason": "", "metrics": {**MEASURED, "step_times_ms": [9.0, 11.0]},
           "config_hash": "abc", "log": "logs/c0-r0.log", "env": {"hostname": "h"}, "started_at": "t",
           "duration_s": 1.5, "from_a_newer_gpubench": {"k": 1}}
    r = Result.from_json(raw)
    assert (r.status, r.log, r.duration_s, r.extra) == ("ok", "logs/c0-r0.log", 1.5, {"from_a_newer_gpubench": {"k": 1}})
    assert r.get("metrics", "throughput", "median") == 100.0 and r.get("metrics", "nothing", "here") is None
    assert r.to_json() == raw
    with pytest.raises(ValueError, match="unknown status 'fast'"):
        Result(run_id="r", config_id="c", repeat=0, config={"framework": "x"}, status="fast")


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "json"])
def test_lines_read_the_same_with_or_without_the_fast_decoder(tmp_path, monkeypatch, fast):
    """orjson (where installed) and the standard library read the same lines the same way:
    what orjson refuses (NaN from an older or hand-made line, an integer beyond 64 bits) is
    read by the standard library, and a corrupt line is the same error either way."""
    from gpubench.results import store

    if fast:
        pytest.importorskip("orjson")
        assert store._fast_loads is not None
    else:
        monkeypatch.setattr(store, "_fast_loads", None)
    odd = {**line(1), "metrics": None, "log": "w.log"}
    text = json.dumps(line(0)) + "\n" + json.dumps(odd).replace('"w.log"', '"w.log", "x": NaN, "big": 18446744073709551616')
    (tmp_path / "results.jsonl").write_text(text + "\n")
    first, second = load_results(tmp_path)
    assert first.config_id == "c0" and second.log == "w.log"
    assert math.isnan(second.extra["x"]) and second.extra["big"] == 2**64
    (tmp_path / "results.jsonl").write_text(text + "\n{oops\n" + json.dumps(line(2)) + "\n")
    with pytest.raises(InputError, match=re.escape("results.jsonl:3: corrupt result line: Expecting property name "
                                                   "enclosed in double quotes: line 1 column 2 (char 1)")):
        load_results(tmp_path)
