"""The outputs other tools read, read by those tools (or their rules): pytest-benchmark's
compare, the GitHub benchmark action's format, JUnit reports (junitparser), markdown for a CI
job summary; and the report's refusal to open telemetry files outside a run directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from junitparser import Failure, JUnitXml, Skipped, TestSuite

from gpubench.gate.compare import compare
from gpubench.gate.export import to_pytest_benchmark
from gpubench.results.frame import aggregate, results_frame
from gpubench.results.store import load_results
from tests.conftest import REPO, run_cli
from tests.test_gate import results, write_run

# --- pytest-benchmark ----------------------------------------------------------------------------

# five noisy repeats, one process of which ran at a fifteenth of the speed (the probe's case), and
# four repeats (an even number: gpubench's median is the mean of the middle two)
NOISY = {"cnn": [17744.0, 1262.0, 18000.0, 17000.0, 19000.0], "mlp": [500.0, 700.0, 520.0, 510.0]}


def _pytest_benchmark(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    cli = shutil.which("pytest-benchmark", path=os.path.dirname(sys.executable)) or shutil.which("pytest-benchmark")
    assert cli, "pytest-benchmark's command is installed with the test extra"
    proc = subprocess.run([cli, "compare", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _table(text: str) -> dict[str, dict[str, float]]:
    """pytest-benchmark compare's terminal table: name -> column -> value, in seconds per
    sample for the time columns and operations (samples) per second for OPS."""
    lines = text.splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("Name (time in "))
    time_scale = {"n": 1e9, "u": 1e6, "m": 1e3, "": 1.0}[re.match(r"Name \(time in (\w?)s\)", lines[head]).group(1)]
    columns = re.findall(r"(Min|Max|Mean|StdDev|Median|IQR|OPS(?: \((\w)ops/s\))?|Rounds)", lines[head])
    out: dict[str, dict[str, float]] = {}
    for line in lines[head + 2:]:
        if line.startswith("-"):
            break
        name, rest = line.split(None, 1)
        values = [float(v.replace(",", "")) for v in re.findall(r"([\d,]+\.?\d*)(?: \(\S*\))?", rest)]
        row = {}
        for (col, ops_prefix), v in zip(columns, values):
            key = col.split()[0].lower()
            if key == "ops":
                row[key] = v * {"": 1.0, "K": 1e3, "M": 1e6}[ops_prefix]
            elif key == "rounds":
                row[key] = v
            else:
                row[key] = v / time_scale
        out[name] = row
    return out


def _gpubench_figures(run: Path) -> dict[str, float]:
    """Each config's throughput as gpubench's report gives it (the median over repeats)."""
    configs = aggregate(results_frame(load_results(run)))
    return dict(zip(configs["config_id"], configs["throughput"].astype(float)))


def test_pytest_benchmark_compare_shows_gpubench_throughput(tmp_path):
    run = write_run(tmp_path / "noisy", NOISY)
    proc = run_cli(["export", str(run), "--format", "pytest-benchmark", "--out", "pb.json"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    figures = _gpubench_figures(run)
    assert figures == {"cnn": 17744.0, "mlp": 515.0}
    # the gate's own figure is the same median
    verdicts = compare(load_results(run), load_results(run), threshold=0.5, noise_floor=0.01, alpha=0.5).verdicts
    assert {v.config_id: v.baseline_median for v in verdicts} == figures

    shown = _table(_pytest_benchmark("pb.json", "--columns=min,max,mean,median,ops,rounds", cwd=tmp_path).stdout)
    for config_id, repeats in NOISY.items():
        row = shown[config_id]
        # OPS: gpubench's throughput in samples/s; Median: 1 / that (seconds per sample)
        assert row["ops"] == pytest.approx(figures[config_id], rel=1e-6)
        assert row["median"] == pytest.approx(1 / figures[config_id], rel=1e-4)
        # the rounds are the repeats, each 1 / its throughput: never the steps of every repeat pooled
        assert row["rounds"] == len(repeats)
        assert row["min"] == pytest.approx(1 / max(repeats), rel=1e-4)
        assert row["max"] == pytest.approx(1 / min(repeats), rel=1e-4)
        assert row["mean"] == pytest.approx(statistics.mean(1 / r for r in repeats), rel=1e-4)
    # with an odd number of repeats the Median is also the middle round's, as pytest-benchmark computes it
    data = {b["name"]: b for b in json.loads((tmp_path / "pb.json").read_text())["benchmarks"]}
    assert data["cnn"]["stats"]["median"] == pytest.approx(statistics.median(data["cnn"]["stats"]["data"]))
    assert sorted(data["mlp"]["stats"]["data"])[1] <= data["mlp"]["stats"]["median"] <= sorted(
        data["mlp"]["stats"]["data"])[2]
    assert data["cnn"]["extra_info"]["throughput_per_repeat"] == NOISY["cnn"]
    # the CSV pytest-benchmark writes holds the same figures unrounded
    _pytest_benchmark("pb.json", "--columns=median,ops", "--csv=pb.csv", cwd=tmp_path)
    rows = {r.split(",")[0]: r.split(",") for r in (tmp_path / "pb.csv").read_text().splitlines()[1:]}
    assert float(rows["gpubench::cnn"][2]) == pytest.approx(17744.0)
    assert float(rows["gpubench::mlp"][1]) == pytest.approx(1 / 515.0)


def test_pytest_benchmark_compare_fail_checks_gpubench_medians(tmp_path):
    """``--benchmark-compare-fail=median:5%`` compares the stored stats of the two sides (as
    pytest-benchmark's session does, check.fails(current, compared)): a config 8% slower in
    every repeat fails it, one unchanged does not."""
    from pytest_benchmark.utils import parse_compare_fail

    base = write_run(tmp_path / "base", {"cnn": [1000.0, 1010.0, 990.0], "mlp": [500.0, 505.0, 495.0]})
    slow = write_run(tmp_path / "slow", {"cnn": [920.0, 929.2, 910.8], "mlp": [500.0, 505.0, 495.0]})
    for run in (base, slow):
        proc = run_cli(["export", str(run), "--format", "pytest-benchmark", "--out", f"{run.name}.json"],
                       cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    stats = {name: {b["name"]: b["stats"] for b in json.loads((tmp_path / f"{name}.json").read_text())["benchmarks"]}
             for name in ("base", "slow")}
    check = parse_compare_fail("median:5%")
    assert "has failed PercentageRegressionCheck" in check.fails(stats["slow"]["cnn"], stats["base"]["cnn"])
    assert check.fails(stats["slow"]["mlp"], stats["base"]["mlp"]) is None
    assert parse_compare_fail("mean:5%").fails(stats["slow"]["cnn"], stats["base"]["cnn"])
    # both files side by side in pytest-benchmark's table: the slower one's OPS is its throughput
    shown = _pytest_benchmark("base.json", "slow.json", "--columns=median,ops", "--group-by=name",
                              cwd=tmp_path).stdout
    assert "920.0000" in shown and "1,000.0000" in shown


def test_pytest_benchmark_export_in_process_has_one_benchmark_per_config():
    rs = results({"cnn": [100.0, 300.0, 200.0]})
    (bench,) = to_pytest_benchmark(rs, {})["benchmarks"]
    assert (bench["name"], bench["stats"]["rounds"], bench["stats"]["ops"]) == ("cnn", 3, 200.0)
    assert bench["stats"]["data"] == pytest.approx([1 / 100, 1 / 300, 1 / 200])


# --- the GitHub benchmark action (customBiggerIsBetter) ------------------------------------------

# what the action's extract.ts accepts (zod: name, value, unit coerced; range, extra optional
# strings) and how extractRangeInfo reads a range: "±" or "+-", then a number
RANGE = re.compile(r"^(\+-|±)\s*(?P<value>\d.*)$")


def test_github_action_export_is_gpubench_figure_one_entry_per_config(tmp_path):
    run = write_run(tmp_path / "noisy", NOISY)
    proc = run_cli(["export", str(run), "--format", "github-action"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    entries = json.loads(proc.stdout)
    assert isinstance(entries, list) and len({e["name"] for e in entries}) == len(entries) == 2
    figures = _gpubench_figures(run)
    for e in entries:
        assert set(e) <= {"name", "value", "unit", "range", "extra"}
        assert isinstance(e["name"], str) and isinstance(e["unit"], str) and isinstance(e["extra"], str)
        assert e["unit"] == "samples/s" and e["value"] == pytest.approx(figures[e["name"]], abs=1e-3)
        m = RANGE.match(e["range"])
        assert m and float(m.group("value")) == pytest.approx(
            (max(NOISY[e["name"]]) - min(NOISY[e["name"]])) / 2, abs=1e-3)
    # one repeat: the range is half its 95% CI (0.9 to 1.1 of the rate in these results)
    one = write_run(tmp_path / "one", {"cnn": [1000.0]})
    (e,) = json.loads(run_cli(["export", str(one), "--format", "github-action"], cwd=tmp_path).stdout)
    assert e["value"] == 1000.0 and float(RANGE.match(e["range"]).group("value")) == pytest.approx(100.0)


def test_exports_refuse_a_name_for_two_configs_and_a_repeat_twice(tmp_path):
    run = write_run(tmp_path / "run", {"cnn": [1000.0, 1010.0]})
    path = run / "results.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[0]["config_hash"], lines[1]["config_hash"] = "aaaaaaaaaaaa", "bbbbbbbbbbbb"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    for fmt in ("github-action", "pytest-benchmark"):
        proc = run_cli(["export", str(run), "--format", fmt], cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr == (
            f"gpubench: error: {path}: config id cnn names two configs (hashes aaaaaaaaaaaa and bbbbbbbbbbbb); an "
            "export needs one name per config\n"), proc.stderr
    lines[1]["config_hash"], lines[1]["repeat"] = "aaaaaaaaaaaa", 0
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = run_cli(["export", str(run), "--format", "github-action"], cwd=tmp_path)
    assert proc.returncode == 2 and "config cnn repeat 0" in proc.stderr and proc.stdout == ""  # not counted twice


# --- JUnit ---------------------------------------------------------------------------------------

def _one_suite(path: Path) -> TestSuite:
    xml = JUnitXml.fromfile(str(path))
    suites = [xml] if isinstance(xml, TestSuite) else list(xml)
    assert len(suites) == 1
    return suites[0]


def _error_line(stderr: str) -> str:
    assert stderr.count("\n") == 1 and stderr.startswith("gpubench: error: "), stderr
    return stderr.removeprefix("gpubench: error: ").rstrip("\n")


def test_junit_verdicts_read_by_junitparser(tmp_path):
    rng = np.random.default_rng(7)
    base = {"slow": 1000 * np.exp(rng.normal(0, 0.01, 10)), "same": 1000 * np.exp(rng.normal(0, 0.01, 10)),
            "wide": 1000 * np.exp(rng.normal(0, 0.15, 10))}
    cur = {"slow": 880 * np.exp(rng.normal(0, 0.01, 10)), "same": 1000 * np.exp(rng.normal(0, 0.01, 10)),
           "wide": 970 * np.exp(rng.normal(0, 0.15, 10))}
    a = write_run(tmp_path / "a", {k: list(v) for k, v in base.items()})
    b = write_run(tmp_path / "b", {k: list(v) for k, v in cur.items()})
    proc = run_cli(["compare", str(a), str(b), "--junit", "v.xml"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    suite = _one_suite(tmp_path / "v.xml")
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (3, 1, 0, 1)
    cases = {c.name: c for c in suite}
    assert cases["slow"].is_failure and isinstance(cases["slow"].result[0], Failure)
    assert cases["slow"].result[0].message.startswith("regressed: -12.")
    assert cases["wide"].is_skipped and isinstance(cases["wide"].result[0], Skipped)
    assert cases["wide"].result[0].message.startswith("inconclusive: ")
    assert cases["same"].is_passed and cases["same"].system_out.startswith("unchanged: ")


@pytest.mark.parametrize("case", ["missing baseline", "corrupt results", "too few repeats"])
def test_compare_refused_as_bad_input_still_writes_its_junit(tmp_path, case):
    a = write_run(tmp_path / "a", {"cnn": [1000.0] * 6})
    other = a
    if case == "missing baseline":
        a = tmp_path / "gone"
    elif case == "corrupt results":
        with (a / "results.jsonl").open("a") as f:
            f.write('{"schema_version": 1, "run_id": "a"}\n{"not json\n\n')
    else:
        other = write_run(tmp_path / "one", {"cnn": [1000.0]})
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "gate.xml").write_text("stale")
    proc = run_cli(["compare", str(a), str(other), "--junit", "out/gate.xml"], cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = _error_line(proc.stderr)
    suite = _one_suite(tmp_path / "out" / "gate.xml")
    assert (suite.name, suite.tests, suite.failures, suite.errors, suite.skipped) == ("gpubench compare", 1, 1, 0, 0)
    (test,) = list(suite)
    (failure,) = test.result
    assert isinstance(failure, Failure) and failure.message == line and line in failure.text
    assert not [p for p in (tmp_path / "out").iterdir() if p.name != "gate.xml"]  # written atomically: no temp left


def test_a_junit_path_that_cannot_be_written_is_just_the_one_line(tmp_path):
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    for junit, message in (("afile/x.xml", "--junit afile/x.xml: afile is not a directory"),
                           ("adir", "--junit adir: is a directory; expected a file path")):
        proc = run_cli(["compare", "gone", "gone", "--junit", junit], cwd=tmp_path)
        assert proc.returncode == 2 and _error_line(proc.stderr) == message
    assert list((tmp_path / "adir").iterdir()) == []


def test_ab_refused_as_bad_input_still_writes_its_junit(tmp_path, write_suite):
    suite = write_suite('name = "ab"\n[defaults]\nframework = "fake"\nworkload = "fault"\n')
    proc = run_cli(["ab", str(suite), "--baseline-python", str(tmp_path / "nope"), "--candidate-python",
                    sys.executable, "--junit", "ab.xml", "--no-report"], cwd=tmp_path)
    assert proc.returncode == 2
    line = _error_line(proc.stderr)
    assert line == f"--baseline-python {tmp_path / 'nope'}: no such interpreter"
    suite_xml = _one_suite(tmp_path / "ab.xml")
    (test,) = list(suite_xml)
    assert suite_xml.name == "gpubench ab" and test.is_failure and test.result[0].message == line


# --- markdown for a CI job summary ---------------------------------------------------------------

NASTY = "cnn|x <img src=x onerror=alert(1)>\nnext `code` ![i](http://e/x.png) \\|\x1b"


def md_cells(line: str) -> list[str]:
    """A GitHub-flavoured markdown table row's cells, split as GFM splits them: at each ``|``
    that no backslash escapes."""
    assert line.startswith("|") and line.endswith("|"), line
    cells, cell, i = [], "", 1
    while i < len(line) - 1:
        ch = line[i]
        if ch == "\\" and i + 1 < len(line) - 1:
            cell += line[i: i + 2]
            i += 2
            continue
        if ch == "|":
            cells.append(cell)
            cell = ""
        else:
            cell += ch
        i += 1
    return [*cells, cell]


def _tables(md: str) -> list[list[list[str]]]:
    """Every table of a markdown text: rows of cells, the separator row left out."""
    tables: list[list[list[str]]] = []
    previous = ""
    for line in md.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            if not set(line) <= set("|-: "):
                tables[-1].append(md_cells(line))
        previous = line
    return tables


def _assert_safe(md: str) -> None:
    assert "<img" not in md and "<" not in md.replace("&lt;", "")  # no raw HTML at all
    assert not re.search(r"(?<!\\)\]\(", md)  # no link or image can form: every "](" escaped
    for table in _tables(md):
        assert len({len(row) for row in table}) == 1, table  # every row as wide as the header
    for line in md.splitlines():
        assert "`" not in line.replace("\\`", "") or line.startswith("`*`"), line  # no code span from data


def test_compare_markdown_escapes_ids_and_reasons(tmp_path):
    base = write_run(tmp_path / "a", {NASTY: [1000.0] * 6, "gone|<b>": [1000.0] * 6})
    cur = write_run(tmp_path / "b", {NASTY: [1000.0] * 6, "gone|<b>": [1000.0] * 6})
    lines = [json.loads(x) for x in (cur / "results.jsonl").read_text().splitlines()]
    for x in lines[6:]:
        x["status"], x["reason"] = "error", "RuntimeError: a|b\n<script>alert(1)</script> `x`"
    (cur / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = run_cli(["compare", str(base), str(cur), "--markdown", "gate.md", "--junit", "gate.xml"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the JUnit report holds the same ids, as XML can (the escape character replaced)
    assert {c.name for c in _one_suite(tmp_path / "gate.xml")} == {NASTY.replace("\x1b", "\ufffd"), "gone|<b>"}
    md = (tmp_path / "gate.md").read_text()
    _assert_safe(md)
    (table,) = _tables(md)
    assert [len(row) for row in table] == [7, 7, 7]
    rows = {row[0].strip(): row for row in table[1:]}
    assert set(rows) == {"gone\\|&lt;b&gt;", "cnn\\|x &lt;img src=x onerror=alert(1)&gt; next \\`code\\` "
                                             "!\\[i\\](http://e/x.png) \\\\\\|"}  # the escape character a space, trimmed
    assert rows["gone\\|&lt;b&gt;"][6].strip() == (
        "error: RuntimeError: a\\|b &lt;script&gt;alert(1)&lt;/script&gt; \\`x\\`")


def test_report_summary_escapes_ids_reasons_and_warnings(tmp_path):
    from gpubench.report.build import build_report

    run = tmp_path / "run_a"
    shutil.copytree(REPO / "tests" / "fixtures" / "run_a", run)
    lines = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    ok = next(x for x in lines if x["status"] == "ok")
    ok["config_id"] = NASTY.removesuffix("\x1b")  # (a glyph no chart font has)
    bad = next(x for x in lines if x["status"] != "ok")
    bad["reason"] = "RuntimeError: a|b\n<img src=x onerror=alert(1)> `x`"
    ok["telemetry"] = {"timeline": "telemetry/<img src=x>|.json"}  # missing: a warning quoting it
    (run / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rep = build_report([run], tmp_path / "out")
    md = rep.markdown.read_text()
    _assert_safe(md)
    assert "&lt;img src=x onerror=alert(1)&gt; \\`x\\`" in md and "a\\|b" in md
    assert any(line.startswith("> warning: ") and "&lt;img src=x&gt;\\|.json" in line for line in md.splitlines())
    tables = _tables(md)
    assert any(row[0].strip().startswith("cnn\\|x &lt;img") for table in tables for row in table)


# --- telemetry timelines only from inside their run directory ------------------------------------

def test_report_opens_only_timelines_inside_the_run_directory(tmp_path):
    from gpubench.report.build import build_report
    from tests.test_report import _timeline

    run = tmp_path / "run_a"
    shutil.copytree(REPO / "tests" / "fixtures" / "run_a", run)
    (run / "telemetry").mkdir()
    secret = tmp_path / "outside.json"  # a valid timeline outside the run: charted if it were opened
    secret.write_text(json.dumps(_timeline(True)))
    (run / "telemetry" / "escape.json").symlink_to(secret)
    (run / "telemetry" / "inside.json").write_text(json.dumps(_timeline(False)))
    (run / "telemetry" / "link-in.json").symlink_to(run / "telemetry" / "inside.json")  # a symlink within: fine
    os.mkfifo(run / "telemetry" / "fifo.json")  # opening it would hang the report
    lines = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    ok = [x for x in lines if x["status"] == "ok"]
    refs = [str(secret), "../outside.json", "telemetry/escape.json", "telemetry/fifo.json", "telemetry/../../x",
            "telemetry/link-in.json"]
    assert len(ok) >= len(refs)
    for x, ref in zip(ok, refs):
        x["telemetry"] = {"timeline": ref}
    (run / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    built: list = []  # in a thread: a report that opened the FIFO would hang, and fails here instead
    worker = threading.Thread(target=lambda: built.append(build_report([run], tmp_path / "out")), daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert built, "the report did not finish (did it open the FIFO?)"
    rep = built[0]
    assert rep.index.exists() and rep.markdown.exists()
    names = {p.name for p in rep.charts}
    assert "telemetry_host.png" in names and "telemetry_gpu.png" not in names  # only the one inside was read
    results_file = run / "results.jsonl"
    for x, ref, why in zip(ok, refs, ("an absolute path", "a path with '..'", "leads outside the run directory",
                                      "not a regular file", "a path with '..'")):
        (warning,) = [w for w in rep.warnings if f"telemetry.timeline {ref!r}" in w]
        assert warning.startswith(f"{results_file}: config {x['config_id']} repeat {x['repeat']}: "), warning
        assert why in warning and "not opened" in warning, warning
    assert not [w for w in rep.warnings if "link-in.json" in w]


def test_the_profilers_operator_table_escapes_operator_names():
    """top_ops.md: an operator's name (a framework's or a user's text) cannot split a row or render."""
    from gpubench.measure.ops import OpRow, markdown_table

    rows = [OpRow(name="my|op`<img src=x onerror=alert(1)>\nnext", calls=2, self_cpu_ms=1.5, total_cpu_ms=2.0,
                  self_device_ms=None)]
    lines = markdown_table(rows, "self_cpu_ms", 3.0, "Top | ops")
    row = lines[4]
    assert len(re.findall(r"(?<!\\)\|", row)) == 5  # four cells
    assert "<img" not in "\n".join(lines) and "\n" not in row and lines[0] == "### Top \\| ops"


def test_a_timeline_path_that_cannot_be_resolved_is_left_out_not_a_traceback(tmp_path):
    from gpubench.report.build import _timeline_path

    (tmp_path / "telemetry").mkdir()
    (tmp_path / "telemetry" / "loop").symlink_to(tmp_path / "telemetry" / "loop")
    path, why = _timeline_path(tmp_path, "telemetry/a\0b.json")
    assert path is None and why
    path, why = _timeline_path(tmp_path, "telemetry/loop")  # Python 3.11 raises on the loop; later ones resolve it
    if path is None:
        assert why.startswith("cannot be resolved")
    else:
        with pytest.raises(OSError):  # ... and the report's read fails, which it reports as unreadable
            path.read_bytes()
