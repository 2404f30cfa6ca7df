"""Reports from small committed fixtures (tests/fixtures/run_a, run_b; see make_fixtures.py)."""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import pytest

from gpubench.errors import InputError
from gpubench.report.build import build_report
from tests.conftest import REPO, run_cli

FIX = REPO / "tests" / "fixtures"
CHARTS = ["throughput_vs_batch.png", "speedups.png", "step_times.png", "memory_vs_batch.png"]


@pytest.fixture(scope="module")
def report_a(tmp_path_factory):
    return build_report([FIX / "run_a"], tmp_path_factory.mktemp("rep") / "a")


def test_files_and_charts(report_a):
    assert report_a.index.exists() and report_a.csv.exists() and report_a.markdown.exists()
    assert sorted(p.name for p in report_a.charts) == sorted(CHARTS)
    for p in report_a.charts:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000  # a real, non-trivial image
    assert report_a.warnings == []


def test_html_is_self_contained_and_embeds_every_chart(report_a):
    page = report_a.index.read_text()
    for name in CHARTS:
        assert f'data-file="{name}"' in page
    assert page.count('src="data:image/png;base64,') == len(CHARTS)
    assert not re.search(r'(src|href)="(https?:)?//', page)  # no network fetches
    assert "<script" not in page


def test_throughput_numbers_match_the_fixture(report_a):
    page = report_a.index.read_text()
    # torch fp32 bs32: 32 samples / 40 ms = 800/s, CI from step-time CI 39.6..40.4 ms
    assert "800.0/s [792.1, 808.1]" in page
    assert "1.00k/s [990.1, 1.01k]" in page  # torch fp32 bs64: 64 / 64 ms
    assert "1.60k/s [1.58k, 1.62k] *" in page  # torch amp-bf16 bs64, cv 15%: noisy
    assert "2.00k/s [1.98k, 2.02k]" in page  # tensorflow fp32 bs64


def test_csv_has_one_row_per_config_with_the_numbers(report_a):
    rows = list(csv.DictReader(report_a.csv.open()))
    assert len(rows) == 8
    by_id = {r["config_id"]: r for r in rows}
    r = by_id["cnn-torch-cpu-bs32-fp32-single"]
    assert float(r["throughput"]) == pytest.approx(800.0)
    assert float(r["step_ms"]) == pytest.approx(40.0)
    assert r["status"] == "ok" and r["repeats"] == "1" and r["ci_kind"] == "within-process"
    assert float(by_id["cnn-torch-cpu-bs64-fp32-single"]["peak_memory_bytes"]) == 700 * 2**20
    assert by_id["cnn-torch-cuda-bs32-fp32-single"]["status"] == "unavailable"
    assert by_id["cnn-tensorflow-cpu-bs32-amp-bf16-single"]["reason"] == "ValueError: injected"


def test_markdown_speedups_and_failures(report_a):
    md = report_a.markdown.read_text()
    assert "8 configs: 6 ok, 1 unavailable, 1 error" in md
    # each ratio with the range the two 95% intervals allow (end over opposite end), and what it
    # decides: a noisy side makes the figure decide nothing
    assert "| cnn-torch-cpu-bs32-amp-bf16-single | cnn-torch-cpu-bs32-fp32-single | 1.25x \\[1.23, 1.28] |" in md
    assert ("| cnn-torch-cpu-bs64-amp-bf16-single | cnn-torch-cpu-bs64-fp32-single | 1.60x \\[1.57, 1.63] noisy |"
            in md)
    # every framework over the reference one, PyTorch (was: PyTorch over TensorFlow, 0.50x)
    assert "| cnn-tensorflow-cpu-bs32-fp32-single | cnn-torch-cpu-bs32-fp32-single | 2.00x \\[1.96, 2.04] |" in md
    assert "| cnn-tensorflow-cpu-bs32-amp-bf16-single | error | ValueError: injected |" in md
    assert "| cnn-torch-cpu-bs64-amp-bf16-single | 1.60k/s \\[1.58k, 1.62k] * |" in md  # [ escaped (md_cell)


def test_several_runs_side_by_side(tmp_path):
    rep = build_report([FIX / "run_a", FIX / "run_b"], tmp_path / "ab")
    md = rep.markdown.read_text()
    assert "| cnn-torch-cpu-bs32-fp32-single | 800.0 | 640.0 | 0.80x |" in md
    assert "| cnn-torch-cpu-bs64-fp32-single | 1.00k | 1.00k | 1.00x |" in md
    page = rep.index.read_text()
    assert "Runs side by side" in page and "run_b / run_a" in page


def copy_run(tmp_path, name="run_a") -> Path:
    dst = tmp_path / name
    shutil.copytree(FIX / name, dst)
    return dst


def test_truncated_results_still_give_a_report_with_a_warning(tmp_path):
    run = copy_run(tmp_path)
    data = (run / "results.jsonl").read_text()
    (run / "results.jsonl").write_text(data[: len(data) - 200])  # half of the last line
    rep = build_report([run], tmp_path / "out")
    assert any("truncated last line" in w for w in rep.warnings)
    assert len(list(csv.DictReader(rep.csv.open()))) == 7
    assert "truncated last line" in rep.index.read_text() and "truncated last line" in rep.markdown.read_text()


def test_unknown_schema_version_and_corrupt_lines_are_skipped_with_warnings(tmp_path):
    run = copy_run(tmp_path)
    lines = (run / "results.jsonl").read_text().splitlines(keepends=True)
    lines[0] = lines[0].replace('"schema_version":1', '"schema_version":99')
    lines[1] = "{garbage\n"
    (run / "results.jsonl").write_text("".join(lines))
    rep = build_report([run], tmp_path / "out")
    text = " ".join(rep.warnings)
    assert "results.jsonl:1: unknown schema_version 99" in text and "results.jsonl:2: corrupt result line" in text
    assert len(list(csv.DictReader(rep.csv.open()))) == 6


def test_lines_with_only_the_required_fields_give_a_report(tmp_path):
    """The store accepts a line whose config names only its framework; the report must not
    then fail on the fields it lacks (a config without a device was a pandas error)."""
    from tests.test_gate import write_run

    run = write_run(tmp_path / "minimal", {"cnn": [100.0, 101.0, 99.0]})
    report = build_report([run], tmp_path / "report")
    assert report.index.exists() and report.warnings == []
    assert "cnn" in report.markdown.read_text()


def test_lines_of_the_wrong_shape_and_an_unreadable_results_file_are_warnings(tmp_path):
    run = copy_run(tmp_path)
    lines = (run / "results.jsonl").read_text().splitlines(keepends=True)
    lines[0] = '{"schema_version": 1, "foo": 2}\n'
    lines[1] = lines[1].replace('"metrics":{', '"metrics":"x","was":{', 1)
    (run / "results.jsonl").write_text("".join(lines))
    (run / "run.json").write_text("[]")
    unreadable = copy_run(tmp_path, "run_b")
    (unreadable / "results.jsonl").unlink()
    (unreadable / "results.jsonl").mkdir()
    rep = build_report([run, unreadable], tmp_path / "out")
    text = " | ".join(rep.warnings)
    assert "results.jsonl:1: 'run_id' missing; a result line needs" in text
    assert "results.jsonl:2: 'metrics' is str \"x\", not an object or null" in text
    assert "run.json: not a run file: expected a JSON object" in text
    assert (f"{unreadable / 'results.jsonl'}: not a regular file (a FIFO, a device or a directory); gpubench reads and "
            "writes only regular files in a run directory; no results from this run") in text
    assert len(list(csv.DictReader(rep.csv.open()))) == 6
    with pytest.raises(InputError, match=r"nothing to report: .*results\.jsonl: not a regular file"):
        build_report([unreadable], tmp_path / "out2")


def test_missing_run_json_and_missing_dirs(tmp_path):
    run = copy_run(tmp_path)
    (run / "run.json").unlink()
    rep = build_report([run, tmp_path / "gone"], tmp_path / "out")
    assert any("run.json: missing" in w for w in rep.warnings)
    assert any("gone: no such run directory" in w for w in rep.warnings)
    with pytest.raises(InputError, match="nothing to report"):
        build_report([tmp_path / "gone"], tmp_path / "out2")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "results.jsonl").write_text("")
    with pytest.raises(InputError, match=r"results\.jsonl: no results \(empty file\)"):
        build_report([empty], tmp_path / "out3")


def test_cli_report_exit_codes(tmp_path):
    proc = run_cli(["report", str(FIX / "run_a"), "--out", str(tmp_path / "r")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"report: {tmp_path / 'r' / 'index.html'}" in proc.stdout
    proc = run_cli(["report", str(tmp_path / "nope")], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpubench: error: nothing to report: {tmp_path / 'nope'}: no such run directory; left out of the report"]
    proc = run_cli(["report", str(FIX / "run_a")], cwd=tmp_path)  # default output: reports/<run_id>
    assert proc.returncode == 0 and (tmp_path / "reports" / "run_a" / "index.html").exists()


def test_page_renders_in_headless_chromium(tmp_path, report_a):
    if not shutil.which("chromium"):
        pytest.skip("chromium is not installed (apt-get install chromium)")
    import subprocess

    from PIL import Image

    shot = tmp_path / "page.png"
    proc = subprocess.run(["bash", str(REPO / "scripts" / "screenshot_report.sh"), str(report_a.index), str(shot),
                           "3000"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    image = Image.open(shot).convert("L")
    assert image.size == (1280, 3000)
    top = image.crop((0, 0, 1280, 1500))
    assert top.getextrema()[0] < 60  # dark text and lines, not a blank page
    assert len(top.histogram()) == 256 and sum(1 for n in top.histogram() if n) > 50  # many shades: text, a chart


AB_SUITE = """
name = "ab-long"
[defaults]
framework = "fake-advise"
workload = "fault"
batch_size = 8
warmup_steps = 1
steps = 4
windows = 2
compile = "xla"
memory_format = "channels-last"
optimizer_impl = "foreach"
threads = 1
[matrix]
mode = [0, 1]
"""


@pytest.mark.slow
def test_an_ab_report_with_long_ids_and_a_failed_config_renders_in_chromium(tmp_path):
    """The report a person opens after ``gpubench ab``: ids of ~100 characters, a config that
    failed on both sides, the A/B's verdict leading; rendered in headless Chromium (the
    screenshot is kept as the test's artifact: looked at in review)."""
    import subprocess
    import sys

    from PIL import Image

    (tmp_path / "s.toml").write_text(AB_SUITE)
    py = sys.executable
    proc = run_cli(["ab", "s.toml", "--lockstep", "--baseline-python", py, "--candidate-python", py, "--repeats", "5",
                    "--alpha", "0.2", "--threshold", "10%", "--out", "runs"], cwd=tmp_path, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the failed config fails the A/B
    (page,) = (tmp_path / "reports").glob("*/index.html")
    html = page.read_text()
    long_id = "fault_mode0-fake-advise-cpu-bs8-fp32-single-compile=xla-memory_format=channels-last-threads=1-" \
              "optimizer_impl=foreach"
    assert f"<td>{long_id}</td>" in html  # the whole id, in the verdicts and the tables
    assert '<h2 id="ab">A/B verdict: no regression: ' in html and "<th>candidate</th>" in html
    assert "10 repeat(s) failed, so the A/B failed (exit 1)" in html  # mode 1, 5 rounds a side
    failed = long_id.replace("mode0", "mode1")
    assert "injected failure in build" in html.split('id="problems"')[1] and failed in html
    if not shutil.which("chromium"):
        pytest.skip("chromium is not installed (apt-get install chromium)")
    shot = tmp_path / "ab.png"
    shown = subprocess.run(["bash", str(REPO / "scripts" / "screenshot_report.sh"), str(page), str(shot), "2400"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    image = Image.open(shot).convert("L")
    assert image.size == (1280, 2400)
    top = image.crop((0, 0, 1280, 1200))
    assert top.getextrema()[0] < 60 and sum(1 for n in top.histogram() if n) > 50  # text and tables, not blank
    # nothing drawn past the page's column: the right margin (max-width 1200 px, centred) is blank
    assert image.crop((1250, 0, 1280, 2400)).getextrema()[0] > 200


def _timeline(gpu: bool) -> dict:
    """A synthetic timeline: cold start 0-50 ms, warm-up to 500 ms, two windows to 1.5 s;
    utilisation 5% outside the windows and 95% inside, power 100 W idle and 400 W busy."""
    phases = [{"name": "cold_start", "start_ms": 0.0, "end_ms": 50.0},
              {"name": "warmup", "start_ms": 50.0, "end_ms": 500.0},
              {"name": "window_0", "start_ms": 500.0, "end_ms": 1000.0},
              {"name": "window_1", "start_ms": 1000.0, "end_ms": 1500.0}]
    ts = [i * 100.0 for i in range(-2, 19)]
    busy = [500.0 <= t <= 1500.0 for t in ts]
    g = [{"t_ms": t, "index": 0, "util_gpu_pct": 95 if b else 5, "util_mem_pct": 40, "mem_used_bytes": 3 * 2**30,
          "mem_total_bytes": 80 * 2**30, "power_w": 400.0 if b else 100.0, "energy_mj": int(t * 300),
          "sm_clock_mhz": 1980 if b else 345, "mem_clock_mhz": 2619, "temp_c": 40, "clock_event_reasons": 0,
          "pstate": 0} for t, b in zip(ts, busy)]
    h = [{"t_ms": t, "cpu_percent": 100.0 if b else 20.0, "rss_bytes": 2**30, "system_cpu_percent": 55.0}
         for t, b in zip(ts[::3], busy[::3])]
    return {"interval_ms": 100, "host_interval_ms": 300, "power_source": "instant", "phases": phases,
            "gpu": g if gpu else [], "host": h}


def test_telemetry_timelines_become_charts_and_energy_table(tmp_path):
    import json

    run = copy_run(tmp_path)
    lines = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    (run / "telemetry").mkdir()
    with_gpu = "cnn-torch-cuda-bs32-fp32-single"
    ok_cpu = [r for r in lines if r["status"] == "ok"][:2]
    assert not any(r["config_id"] == with_gpu for r in ok_cpu)
    for i, r in enumerate(ok_cpu):
        gpu = i == 0  # pretend the first one ran on a GPU
        rel = f"telemetry/{r['config_id']}-r0.json"
        (run / rel).write_text(json.dumps(_timeline(gpu)))
        r["telemetry"] = {"interval_ms": 100, "host": {"cpu_percent_mean": 100.0}, "timeline": rel,
                          "gpu": {"energy_per_sample_j": 0.125, "energy_source": "counter"} if gpu else None,
                          "gpu_reason": None if gpu else "not a GPU config", "errors": []}
    lines[2]["telemetry"] = {"gpu": None, "timeline": "telemetry/gone.json"}  # referenced, missing
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))

    rep = build_report([run], tmp_path / "out")
    names = sorted(p.name for p in rep.charts)
    assert names == sorted(CHARTS + ["telemetry_gpu.png", "telemetry_host.png"])
    for name in ("telemetry_gpu.png", "telemetry_host.png"):
        data = (rep.out / "charts" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    page = rep.index.read_text()
    assert 'data-file="telemetry_gpu.png"' in page and 'data-file="telemetry_host.png"' in page
    assert "No telemetry timelines" not in page
    assert [w for w in rep.warnings if "gone.json" in w and "unreadable" in w]
    # energy per sample of the GPU config: 0.125 J
    assert 'id="energy"' in page and "125 mJ" in page


def test_a_multi_gpu_timeline_draws_a_line_per_gpu(tmp_path, monkeypatch):
    import matplotlib.figure

    from gpubench.report import charts

    one = _timeline(True)
    two = dict(one, gpu=one["gpu"] + [dict(s, index=3, util_gpu_pct=50) for s in one["gpu"]])
    drawn = []

    def savefig(fig, path, **kw):  # records the lines drawn; writes a file, as charts are written atomically
        drawn.append([[ln.get_label() for ln in ax.get_lines()] for ax in fig.axes])
        Path(path).write_bytes(b"png")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    charts.telemetry_timelines([("two GPUs", two), ("one GPU", one)], "gpu", tmp_path / "t.png")
    (axes,) = drawn
    panels = len(charts.GPU_PANELS)
    assert axes[:panels] == [["GPU 0", "GPU 3"]] * panels  # the two-GPU config: one line per device
    assert all(len(lines) == 1 for lines in axes[panels:2 * panels])  # one GPU: one unlabelled line


def test_a_language_models_tokens_per_second_is_charted_against_its_sequence_length(tmp_path):
    """Two sequence lengths of a gpt: a tokens/s chart (x: tokens a sequence, y: throughput x
    that), tokens/s in the throughput table and summary.md; with one length, no such chart."""
    import json

    from gpubench.config import Config
    from gpubench.workloads import get_workload
    from tests.conftest import make_result

    def gpt(seq_len: int, framework: str, rate: float):
        params = {"layers": 1, "d_model": 32, "heads": 2, "seq_len": seq_len, "vocab": 64}
        config = Config(workload="gpt", framework=framework, batch_size=4, workload_params=tuple(sorted(params.items())))
        r = make_result(config, rate)
        r.model = get_workload("gpt").spec(**params).facts()
        return r

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"run_id": "r", "schema_version": 1, "env": {}, "suite": {}}))
    results = [gpt(16, "torch", 100.0), gpt(32, "torch", 60.0), gpt(16, "jax", 80.0), gpt(32, "jax", 50.0)]
    (run / "results.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in results))
    rep = build_report([run], tmp_path / "out")
    assert "tokens_vs_seq_len.png" in [p.name for p in rep.charts]
    md = rep.markdown.read_text()
    header = next(line for line in md.splitlines() if line.startswith("| config"))
    assert "| tokens/s |" in header
    assert "1.92k" in md and "1.60k" in md  # 60 x 32 and 50 x 32 tokens/s
    assert "(1.60k tokens/s)" in rep.index.read_text()
    (run / "results.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in results[::2]))
    rep = build_report([run], tmp_path / "out2")
    assert "tokens_vs_seq_len.png" not in [p.name for p in rep.charts]


def test_tensor_core_activity_is_a_column_and_a_chart_against_mfu(tmp_path):
    """GPU results with NVML GPM's tensor-core activity: a "tensor %" column in summary.md and the
    terminal's table, and MFU charted against it; results without it have neither."""
    import json

    from rich.console import Console

    from gpubench.config import Config
    from gpubench.runner.progress import summary_table
    from tests.conftest import make_result

    def gpu_result(batch: int, mfu: float, tensor: float | None):
        r = make_result(Config(workload="cnn", device="cuda", batch_size=batch), 1000.0 * batch,
                        mfu=mfu, achieved_tflops=mfu * 100, peak_tflops=100.0)
        r.telemetry = {"gpu": {"tensor_active_pct_mean": tensor}}
        r.model = {"flops_counted_by": "gpubench, from the spec (convolutions and matrix multiplies)"}
        return r

    def on_h100(r):  # the datasheet's MFU beside the measured peak's: each named by its denominator
        r.metrics.update(mfu_datasheet=r.metrics["achieved_tflops"] / 66.9, datasheet_tflops=66.9,
                         datasheet={"label": "NVIDIA H100 SXM5 80GB", "source": "the H100 datasheet",
                                    "device_name": "NVIDIA H100 80GB HBM3", "precision": "fp32",
                                    "per_device_tflops": 66.9, "devices": 1, "dense": True})
        return r

    def report(results, name):
        run = tmp_path / name
        run.mkdir()
        (run / "run.json").write_text(json.dumps({"run_id": name, "schema_version": 1, "env": {}, "suite": {}}))
        (run / "results.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in results))
        return build_report([run], tmp_path / f"{name}-out")

    measured = [on_h100(gpu_result(64, 0.12, 20.5)), on_h100(gpu_result(256, 0.31, 55.0))]
    rep = report(measured, "gpm")
    assert "mfu_vs_tensor.png" in [p.name for p in rep.charts]
    header = next(line for line in rep.markdown.read_text().splitlines() if line.startswith("| config"))
    assert header.endswith("| MFU (measured peak) | MFU (datasheet peak) | tensor % |")
    assert "| 31.0% | 46.3% | 55 |" in rep.markdown.read_text()  # 31 TFLOP/s of 100 measured, of 66.9 datasheet
    # the FLOP convention beside the MFUs
    assert "FLOPs of cnn: counted by gpubench, from the spec (convolutions and matrix multiplies)" in (
        rep.markdown.read_text())
    page = rep.index.read_text()
    assert "MFU 31.0% of the measured peak, MFU 46.3% of the datasheet peak" in page
    assert "NVIDIA H100 SXM5 80GB: the H100 datasheet" in page  # the peaks used, with the datasheet row
    console = Console(width=250, record=True)
    console.print(summary_table(measured))
    table = console.export_text()
    assert "tensor %" in table and "MFU sheet" in table
    rep = report([gpu_result(64, 0.12, None), gpu_result(256, 0.31, None)], "none")
    assert "mfu_vs_tensor.png" not in [p.name for p in rep.charts] and "tensor %" not in rep.markdown.read_text()


def test_a_speed_up_carries_its_range_and_whether_it_decides_anything():
    """The ratio's range from the two 95% intervals (end over opposite end); decided only where
    it excludes 1 and neither side is noisy: the chart colours only those."""
    from gpubench.config import Config
    from gpubench.results.frame import aggregate, results_frame
    from gpubench.results.twins import COMPARISONS, speedup_text, speedups
    from tests.conftest import make_result

    results = []
    for batch, (fp32, bf16, cv) in {32: (800, 1000, 0.01), 64: (1000, 1600, 0.15), 128: (1000, 1010, 0.01)}.items():
        for precision, rate in (("fp32", fp32), ("amp-bf16", bf16)):
            r = make_result(Config(workload="cnn", framework="torch", batch_size=batch, precision=precision), rate)
            r.metrics["throughput"] = {"median": rate, "ci_low": rate * 0.97, "ci_high": rate * 1.03}
            r.metrics["step_time_ms"]["cv"] = cv if precision != "fp32" else 0.01
            r.metrics["noisy"] = r.metrics["step_time_ms"]["cv"] > 0.1  # as the worker records it
            results.append(r)
    precision = next(c for c in COMPARISONS if c.axis == "precision")
    rows = {r["config_id"].split("-")[3]: r for _, r in speedups(aggregate(results_frame(results)), precision).iterrows()}
    assert rows["bs32"]["speedup_low"] == pytest.approx(970 / 824) and rows["bs32"]["decided"]
    assert speedup_text(rows["bs32"]) == "1.25x [1.18, 1.33]"
    assert speedup_text(rows["bs64"]) == "1.60x [1.51, 1.70] noisy" and not rows["bs64"]["decided"]
    assert speedup_text(rows["bs128"]) == "1.01x [0.95, 1.07] undecided" and not rows["bs128"]["decided"]


def test_series_at_the_same_batch_are_nudged_apart_around_it():
    """Three frameworks at the same throughput once drew one line: each series is moved a
    fixed share of an octave sideways, centred on the true batch."""
    from gpubench.report.charts import dodge

    factors = [dodge(k, 3) for k in range(3)]
    assert factors[1] == 1.0 and factors[0] * factors[2] == pytest.approx(1.0)
    assert factors[0] < 1.0 < factors[2] and factors[2] == pytest.approx(2 ** 0.06)
    assert dodge(0, 1) == 1.0


def test_chart_labels_wrap_whole_never_cut():
    """A chart's legend entry or tick label of any length is kept whole over lines of at most the
    width (the long ids of a factory with a batch function once read `fake-advise fp32 compile=…`
    for both sides of an A/B)."""
    from gpubench.report.charts import wrap

    label = ("fault_mode0-fake-advise-cpu-bs8-fp32-single-compile=xla-memory_format=channels-last-threads=1-"
             "optimizer_impl=foreach-batches=gptfactory.token_batches_with_targets (candidate)")
    lines = wrap(label, 48).split("\n")
    assert "".join(lines) == label.replace(" ", "")  # every character kept, a line break for the space
    assert all(len(line) <= 48 for line in lines) and len(lines) == 5 and lines[-1] == "(candidate)"
    assert wrap("x" * 100, 48).split("\n") == ["x" * 48, "x" * 48, "x" * 4]
    assert wrap("PyTorch fp32") == "PyTorch fp32"


def test_the_loss_curves_are_drawn_against_samples(tmp_path):
    """Each config's loss of every step (metrics.loss.curve) against the samples trained, the
    median over its repeats at the steps all of them took: a chart of its own."""
    import json

    from gpubench.report.build import _loss_curves
    from gpubench.report.load import load_report_data

    run = copy_run(tmp_path)
    lines = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    ok = [r for r in lines if r["status"] == "ok"][:2]
    for r, curve in zip(ok, ([2.0, 1.5, 1.0, 0.8], [2.2, 1.3, 1.2])):
        r["metrics"]["loss"] = {"first": curve[0], "last": curve[-1], "curve": curve}
    ok[1]["config_id"], ok[1]["config"] = ok[0]["config_id"], ok[0]["config"]  # a second repeat of the first
    ok[1]["repeat"], ok[1]["metrics"]["samples_per_step"] = 1, ok[0]["metrics"]["samples_per_step"]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))

    per = ok[0]["metrics"]["samples_per_step"]
    curves = _loss_curves(load_report_data([run]))
    samples, losses = curves[ok[0]["config"]["workload"]][ok[0]["config_id"]]
    assert samples == [per, 2 * per, 3 * per] and losses == pytest.approx([2.1, 1.4, 1.1])
    rep = build_report([run], tmp_path / "out")
    chart = rep.out / "charts" / "loss_vs_samples.png"
    assert chart in rep.charts and chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 'data-file="loss_vs_samples.png"' in rep.index.read_text()


def test_a_config_on_the_terms_of_a_published_run_is_shown_beside_it(tmp_path):
    """ResNet-50 at amp-fp16, batch 256, channels-last on one A100 80GB SXM meets the terms of
    NVIDIA's published 2,470 img/s; the same on an H100, or at batch 128, does not. GPT-2 (124M)
    at amp-bf16 with a datasheet MFU stands beside llm.c's and nanoGPT's MFUs on any GPU of the
    table. Both in summary.md and the page, each with its source and what differs."""
    import json

    from gpubench.config import Config
    from gpubench.report.references import GPT2_SMALL_PARAMS, RESNET50_PARAMS
    from tests.conftest import make_result

    def on(gpu: str, config: Config, rate: float, params: int, **metrics):
        r = make_result(config, rate, **metrics)
        r.model = {"params": params}
        r.env = {"frameworks": {"torch": {"devices": [{"name": "cuda:0", "model": gpu}]}}}
        return r

    resnet = dict(workload="resnet50", device="cuda", precision="amp-fp16", memory_format="channels-last")
    gpt = Config(workload="gpt", device="cuda", precision="amp-bf16", batch_size=8,
                 workload_params=(("d_model", 768), ("heads", 12), ("layers", 12), ("seq_len", 1024),
                                  ("vocab", 50257)))
    results = [on("NVIDIA A100-SXM4-80GB", Config(**resnet, batch_size=256), 1976.0, RESNET50_PARAMS),
               on("NVIDIA H100 80GB HBM3", Config(**resnet, batch_size=256, compile="torch-compile"), 3000.0,
                  RESNET50_PARAMS),
               on("NVIDIA A100-SXM4-80GB", Config(**resnet, batch_size=128), 1900.0, RESNET50_PARAMS),
               on("NVIDIA H100 80GB HBM3", gpt, 60.0, GPT2_SMALL_PARAMS, mfu_datasheet=0.315)]
    run = tmp_path / "r"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"run_id": "r", "schema_version": 1, "env": {}, "suite": {}}))
    (run / "results.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in results))
    rep = build_report([run], tmp_path / "out")
    md = rep.markdown.read_text()
    section = md.split("### Beside published figures", 1)[1].split("###", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| resnet50") or line.startswith("| gpt")]
    assert len(rows) == 3, section  # the A100 batch-256 ResNet-50, and GPT-2 beside llm.c and nanoGPT
    (a100,) = [line for line in rows if line.startswith("| resnet50")]
    assert "bs256" in a100 and "1,976 samples/s" in a100 and "2,470 samples/s" in a100 and "0.80x" in a100
    assert "resnet50v1.5/README.md" in a100 and "ImageNet JPEGs" in a100
    llmc, nanogpt = (next(line for line in rows if name in line) for name in ("llm.c", "nanoGPT"))
    assert "31.5%" in llmc and "63%" in llmc and "0.50x" in llmc and "231k tokens/s" in llmc
    assert "23%-29%" in nanogpt and "1.21x" in nanogpt
    assert "Beside published figures" in rep.index.read_text()
