"""The metric registry: one declaration per metric, read by the frame, the CSV, the summaries
and the gate."""

from __future__ import annotations

import csv
import shutil

import pytest

from gpubench import fmt
from gpubench.config import Config
from gpubench.gate.compare import compare
from gpubench.report.build import build_report
from gpubench.results import metrics
from gpubench.results.frame import aggregate, results_frame
from gpubench.results.metrics import KINDS, METRICS, Metric, register_metric
from gpubench.results.store import append_result, load_results
from tests.conftest import REPO, make_result

SAMPLES = sorted((REPO / "reports" / "samples").glob("*/run"))


def test_every_kind_has_a_writer_and_every_metric_a_valid_declaration():
    assert set(fmt.BY_KIND) == set(KINDS)
    assert fmt.metric("bytes", 3 * 2**20) == "3.0 MiB" and fmt.metric("pct", None) == "-"
    assert len({m.name for m in METRICS}) == len(METRICS)
    with pytest.raises(ValueError, match="give a path or a derive function"):
        Metric("x", (), "", "", "count", "neither")
    with pytest.raises(ValueError, match="better, kind or combine"):
        Metric("x", ("metrics", "x"), "", "up", "count", "bad direction")


def test_the_registry_reads_every_committed_sample():
    """Every path of the registry resolves on real results: the measured figures are there on
    every ok line, and the frame has a column per metric."""
    assert SAMPLES
    for run_dir in SAMPLES:
        results = load_results(run_dir)
        frame = results_frame(results)
        assert {m.name for m in METRICS} <= set(frame.columns)
        ok = frame[frame["status"] == "ok"]
        for name in ("throughput", "throughput_ci_low", "step_ms", "step_cv", "cold_start_ms", "peak_memory_bytes",
                     "params", "flops_per_sample", "batch_trained", "devices", "samples_per_step"):
            assert ok[name].notna().all(), (run_dir, name)
        # throughput = samples per step x 1000 / median step time, on every ok line
        assert ((ok["throughput"] - ok["samples_per_step"] * 1000 / ok["step_ms"]).abs() < 1e-6 * ok["throughput"]).all()


@pytest.fixture
def extra_metric():
    """A plugin's metric, registered for one test: the loss after the first window."""
    m = Metric("loss_window0", (), "", "lower", "number", "the loss after the first window", gate=True,
               derive=lambda r: (r.get("metrics", "loss", "windows") or [None])[0])
    register_metric(m)
    yield m
    metrics.METRICS.remove(m)
    del metrics.BY_NAME[m.name], metrics.GATE_METRICS[m.name]


def test_a_registered_metric_reaches_the_frame_the_csv_and_the_gate(tmp_path, extra_metric):
    run = SAMPLES[0]
    shutil.copytree(run, tmp_path / "run")
    results = load_results(tmp_path / "run")
    frame = aggregate(results_frame(results))
    ok = frame[frame["status"] == "ok"]
    assert ok["loss_window0"].notna().all()
    report = build_report([tmp_path / "run"], tmp_path / "report")
    with open(report.csv) as f:
        rows = list(csv.DictReader(f))
    assert all(r["loss_window0"] for r in rows if r["status"] == "ok")
    # and the gate compares it (lower is better): a loss 30% higher is a regression
    cfg = Config(workload="mlp")
    base = [make_result(cfg, repeat=i, loss={"windows": [2.0 + 0.01 * i]}) for i in range(6)]
    cur = [make_result(cfg, repeat=i, loss={"windows": [2.6 + 0.01 * i]}) for i in range(6)]
    verdict = compare(base, cur, "loss_window0", threshold=0.05, noise_floor=0.01).verdicts[0]
    assert (verdict.verdict, round(verdict.ratio, 2)) == ("regressed", 1.3)
    with pytest.raises(ValueError, match="registered already"):
        register_metric(extra_metric)


def test_results_round_trip_through_the_store_unchanged(tmp_path):
    for r in load_results(SAMPLES[0])[:5]:
        append_result(tmp_path, r)
    again = load_results(tmp_path)
    assert [r.to_json() for r in again] == [r.to_json() for r in load_results(SAMPLES[0])[:5]]
