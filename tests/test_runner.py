"""Runner isolation and the CLI, as real subprocesses (fake numpy backend: fast)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import fake_suite, plugin_env, result_lines, run_cli

FIXTURES = Path(__file__).parent / "fixtures"
FAULTS = fake_suite("faults", matrix="mode = [0, 1, 2, 3, 4, 5]")


def results_of(out):
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir, {r["config"]["workload_params"]["mode"]: r for r in result_lines(run_dir)}


def test_each_failure_costs_only_its_own_config(tmp_path, write_suite):
    suite = write_suite(FAULTS.replace("timeout_s = 20", "timeout_s = 4"))
    (tmp_path / "prices.toml").write_text('"Some GPU" = 9.0\ncpu = 0.36\n')  # a table the user keeps
    proc = run_cli(["run", str(suite), "--out", "work/runs", "--price", "prices.toml"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # errors and a timeout
    run_dir, by_mode = results_of(tmp_path / "work" / "runs")
    report = tmp_path / "work" / "reports" / run_dir.name  # beside the runs, written even when configs failed
    assert f"report: work/reports/{run_dir.name}/index.html" in proc.stdout and not (tmp_path / "reports").exists()
    assert "injected failure in build" in (report / "summary.md").read_text()
    status = {m: r["status"] for m, r in by_mode.items()}
    assert status == {0: "ok", 1: "error", 2: "timeout", 3: "oom", 4: "error", 5: "diverged"}

    ok = by_mode[0]
    assert ok["metrics"]["loss"]["fell"] is True
    assert ok["metrics"]["throughput"]["median"] > 0
    assert len(ok["metrics"]["step_times_ms"]) == 6
    # --price: the ok config's cost at the CPU's price (0.36 an hour: 0.0001 a second), the failed ones none
    cost = ok["metrics"]["cost"]
    assert (cost["priced_as"], cost["price_per_device_hour"], cost["devices_billed"]) == ("cpu", 0.36, 1)
    assert cost["per_million_samples"] == pytest.approx(0.0001 / ok["metrics"]["throughput"]["median"] * 1e6)
    assert cost["config"] == pytest.approx(0.0001 * ok["duration_s"])
    assert all("cost" not in (by_mode[m]["metrics"] or {}) for m in (1, 2, 3, 4, 5))
    line = f"cost at the prices given (--price): {cost['config']:.4g} for the 1 priced config repeat(s)"
    assert line in " ".join(proc.stdout.split()) and line in (report / "summary.md").read_text()
    # a resume goes on at the run's own prices (run.json); other prices are refused, nothing run
    assert json.loads((run_dir / "run.json").read_text())["args"]["prices"] == {
        "source": "prices.toml", "table": {"Some GPU": 9.0, "cpu": 0.36}}
    again = run_cli(["run", "--resume", str(run_dir), "--price", "3"], cwd=tmp_path)
    assert again.returncode == 2 and (f"--resume {run_dir}: --price 3: that run was priced with prices.toml"
                                      in again.stderr), again.stderr

    assert "ValueError: injected failure in build" in by_mode[1]["reason"]
    assert "Traceback" in by_mode[1]["traceback"] and "injected failure" in by_mode[1]["traceback"]
    assert "no result after 4 s" in by_mode[2]["reason"]
    assert by_mode[3]["reason"].startswith("MemoryError")
    assert by_mode[3]["metrics"]["memory"]["peak_rss_bytes"] > 0
    assert "killed by SIGKILL" in by_mode[4]["reason"]
    assert by_mode[5]["reason"] == "loss became non-finite" and by_mode[5]["metrics"]["loss"]["last"] is None

    # nothing left running and no work directories left behind; logs kept
    assert not list((run_dir / ".work").iterdir())
    assert (run_dir / by_mode[1]["log"]).exists()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["completed"] is True and meta["configs"] == 6
    assert "3 failed" in proc.stdout  # raise, hang, kill
    for r in by_mode.values():
        assert r["schema_version"] == 1 and r["run_id"] == run_dir.name
        assert r["env"]["frameworks"]["fake"]["version"] == "0"


def test_unavailable_and_unsupported_do_not_fail_the_run(tmp_path, write_suite):
    suite = write_suite(FAULTS.replace("mode = [0, 1, 2, 3, 4, 5]", 'device = ["cpu", "cuda"]\nprecision = ["fp32", "tf32"]'))
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--no-report"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, _ = results_of(tmp_path / "runs")
    (run_dir,) = list((tmp_path / "runs").iterdir())
    got = {r["config_id"]: (r["status"], r["reason"]) for r in result_lines(run_dir)}
    assert got["fault_mode0-fake-cpu-bs8-fp32-single"][0] == "ok"
    assert got["fault_mode0-fake-cuda-bs8-fp32-single"] == ("unavailable", "no cuda device here; fake sees: cpu")
    assert got["fault_mode0-fake-cpu-bs8-tf32-single"] == (
        "unsupported", "fake does not support precision = tf32 on cpu; it supports: fp32 (the fake backend has no tf32)")


def test_a_run_that_measures_nothing_exits_1_saying_so_and_still_has_its_report(tmp_path, write_suite):
    """Every config unavailable or unsupported: exit 1 and one line counting the statuses; the
    report (the run's own and `gpubench report`'s) is written, its failures listed, no charts."""
    suite = write_suite(FAULTS.replace("mode = [0, 1, 2, 3, 4, 5]", 'mode = [0]\nprecision = ["fp32", "tf32"]'))
    refused = run_cli(["run", str(suite), "--report-dir", str(suite)], cwd=tmp_path)  # a file: refused first
    assert refused.returncode == 2 and f"argument --report-dir: {suite}: exists and is not a directory" in \
        refused.stderr and not (tmp_path / "runs").exists(), refused.stderr
    proc = run_cli(["run", str(suite), "--out", "runs", "--set", "device=cuda", "--report-dir", "mine"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last == "nothing was measured: unavailable x1, unsupported x1 (the reasons above)", proc.stdout
    assert "report not written" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    index = tmp_path / "mine" / "index.html"  # where --report-dir said
    assert "no cuda device here; fake sees: cpu" in index.read_text()
    assert list((index.parent / "charts").iterdir()) == []
    again = run_cli(["report", str(run_dir), "--out", "again"], cwd=tmp_path)
    assert again.returncode == 0 and (tmp_path / "again" / "summary.md").is_file(), again.stdout + again.stderr


def test_repeats_run_in_rounds_each_in_a_fresh_process(tmp_path, write_suite):
    suite = write_suite(FAULTS.replace("[0, 1, 2, 3, 4, 5]", "[0]\nbatch_size = [4, 8]"))
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--repeats", "2", "--no-report"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    order = [(r["config"]["batch_size"], r["repeat"]) for r in result_lines(run_dir)]
    assert order == [(4, 0), (8, 0), (4, 1), (8, 1)]
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    assert len(logs) == 4


def test_resume_completes_an_interrupted_run(tmp_path, write_suite):
    suite = write_suite(FAULTS.replace("[0, 1, 2, 3, 4, 5]", "[0]\nbatch_size = [1, 2, 3, 4]"))
    out = tmp_path / "runs"
    proc = run_cli(["run", str(suite), "--out", str(out), "--no-report"], cwd=tmp_path)
    assert proc.returncode == 0
    assert not (tmp_path / "reports").exists()
    (run_dir,) = list(out.iterdir())
    results_file = run_dir / "results.jsonl"
    lines = results_file.read_text().splitlines(keepends=True)
    # as if killed while writing the third result: two whole lines and half of the third
    results_file.write_text(lines[0] + lines[1] + lines[2][:40])
    meta = json.loads((run_dir / "run.json").read_text())
    meta["completed"] = False
    (run_dir / "run.json").write_text(json.dumps(meta))
    first_two = [json.loads(l) for l in lines[:2]]

    proc = run_cli(["run", "--resume", str(run_dir), "--no-report"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "truncated last line" in proc.stderr
    results = result_lines(run_dir)
    assert [r["config"]["batch_size"] for r in results] == [1, 2, 3, 4]
    assert results[:2] == first_two  # finished results untouched
    assert json.loads((run_dir / "run.json").read_text())["completed"] is True
    assert len(list(out.iterdir())) == 1  # no new run directory

    again = run_cli(["run", "--resume", str(run_dir), "--no-report"], cwd=tmp_path)
    assert again.returncode == 0 and "0 to run" in again.stdout
    assert len(result_lines(run_dir)) == 4

    # a damaged run.json is refused before anything runs, naming the file and key
    good = json.loads((run_dir / "run.json").read_text())
    for edit, expected in [(lambda m: m["suite"]["matrix"].update(workload=["llama"]), "matrix.workload: unknown workload 'llama'"),
                           (lambda m: m["args"].update(repeats=0), "args.repeats: expected an integer >= 1, got 0")]:
        meta = json.loads(json.dumps(good))
        edit(meta)
        (run_dir / "run.json").write_text(json.dumps(meta))
        proc = run_cli(["run", "--resume", str(run_dir)], cwd=tmp_path)
        assert proc.returncode == 2 and expected in proc.stderr, proc.stdout + proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and str(run_dir / "run.json") in proc.stderr
        assert len(result_lines(run_dir)) == 4


def test_resume_errors(tmp_path):
    proc = run_cli(["run", "--resume", str(tmp_path / "nope")], cwd=tmp_path)
    assert proc.returncode == 2 and "no such run directory" in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = run_cli(["run", "--resume", str(tmp_path / "empty")], cwd=tmp_path)
    assert proc.returncode == 2 and "run.json: missing" in proc.stderr
    shutil.copytree(FIXTURES / "run_a", tmp_path / "wrong")  # a line of the wrong shape
    results = tmp_path / "wrong" / "results.jsonl"
    results.write_text(results.read_text() + '{"schema_version": 1, "foo": 2}\n')
    before = results.read_bytes()
    proc = run_cli(["run", "--resume", str(tmp_path / "wrong")], cwd=tmp_path)
    assert proc.returncode == 2 and f"{results}:9: 'run_id' missing; a result line needs" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and results.read_bytes() == before
    (tmp_path / "wrong" / "run.json").write_text("[]")
    proc = run_cli(["run", "--resume", str(tmp_path / "wrong")], cwd=tmp_path)
    assert proc.returncode == 2 and "run.json: not a run file: expected a JSON object" in proc.stderr, proc.stderr


def _default_disposition(signum: int):
    """preexec_fn: the child starts with ``signum`` at its default disposition, however this
    test runner was started (a shell's background job inherits SIGINT ignored, and a child
    inherits that; Python then installs no KeyboardInterrupt handler)."""
    return lambda: signal.signal(signum, signal.SIG_DFL)


@pytest.mark.parametrize("signum, code, said", [(signal.SIGINT, 130, "gpubench: interrupted"),
                                                (signal.SIGTERM, 143, "gpubench: stopped by SIGTERM")],
                         ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_keeps_finished_results_and_says_how_to_resume(tmp_path, write_suite, signum, code, said):
    """Ctrl-C, and SIGTERM (``kill PID``, a CI job cancelled): the hanging worker is killed
    with its process group, the finished config is kept, stderr says how to resume."""
    suite = write_suite(FAULTS.replace("[0, 1, 2, 3, 4, 5]", "[0, 2]"))
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "gpubench", "run", str(suite), "--out", str(out)],
                            cwd=tmp_path, env=plugin_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_disposition(signum))
    deadline = time.time() + 60
    while time.time() < deadline:  # wait until the hanging config's worker runs (the first one has finished)
        if any("fault_mode2" in " ".join(p.info["cmdline"] or []) and str(out) in " ".join(p.info["cmdline"] or [])
               for p in psutil.process_iter(["cmdline"])):
            break
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == code, stdout + stderr
    (run_dir,) = list(out.iterdir())
    assert f"{said}; finished configs are in {run_dir}/results.jsonl; continue with: gpubench run --resume " \
           f"{run_dir}" in stderr, stderr
    assert "--resume" not in stdout and "Traceback" not in stderr
    assert [r["status"] for r in result_lines(run_dir)] == ["ok"]
    # the hanging worker was killed with its process group
    ps = subprocess.run(["pgrep", "-f", f"gpubench.runner.worker {run_dir}"], capture_output=True, text=True)
    assert ps.stdout.strip() == ""


def _worker_started(out: Path, timeout: float = 60) -> bool:
    """Whether a worker writing under ``out`` appeared within ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any("gpubench.runner.worker" in (cmd := " ".join(p.info["cmdline"] or [])) and str(out) in cmd
               for p in psutil.process_iter(["cmdline"])):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("command, says", [
    (["ab", "{suite}", "--repeats", "8"], "the finished rounds are in {out}/{{id}}/baseline and "
                                          "{out}/{{id}}/candidate; judge them with: gpubench compare"),
    (["find-batch", "{suite}"], "every probe that finished in {out}/{{id}}/results.jsonl; a search is not resumed"),
], ids=["ab", "find-batch"])
def test_ctrl_c_on_every_measuring_command_names_its_directory_and_how_to_go_on(tmp_path, write_suite, command,
                                                                                says):
    """ab and find-batch, as run (above), advise and bisect (their own tests): a Ctrl-C while a
    worker trains is one line naming where what finished is and what to run next."""
    suite = write_suite(FAULTS.replace("[0, 1, 2, 3, 4, 5]", "[2]"))  # a worker that hangs
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "gpubench", *[a.format(suite=suite) for a in command], "--out",
                             str(out)], cwd=tmp_path, env=plugin_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_disposition(signal.SIGINT))
    assert _worker_started(out), proc.communicate(timeout=30)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    (run_id,) = [p.name for p in out.iterdir()]
    assert proc.returncode == 130 and "Traceback" not in stderr, stdout + stderr
    line = f"gpubench: interrupted; {says.format(out=out).format(id=run_id)}"
    assert line in stderr and stderr.count("\n") == 1, stderr


@pytest.mark.parametrize("after_s", [0.2, 0.5, 1.0])
def test_ctrl_c_before_a_command_has_started_is_one_line_too(tmp_path, write_suite, after_s):
    """A Ctrl-C while the command line's modules are still importing (1-2 s on a loaded machine)
    is the same line, not a KeyboardInterrupt traceback."""
    suite = write_suite(FAULTS.replace("[0, 1, 2, 3, 4, 5]", "[2]"))
    proc = subprocess.Popen([sys.executable, "-m", "gpubench", "run", str(suite), "--out", str(tmp_path / "runs")],
                            cwd=tmp_path, env=plugin_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_disposition(signal.SIGINT))
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in stderr, stdout + stderr
    assert stderr.startswith("gpubench: interrupted") and stderr.count("\n") == 1, stderr


@pytest.mark.parametrize("args, message", [
    (["run", "missing.toml"], "missing.toml: no such suite file"),
    (["run", "{suite}", "--set", "precision=fp17"],
     "--set precision=fp17: unknown precision 'fp17'; expected one of: fp32, tf32, amp-fp16, amp-bf16"),
    (["run", "{suite}", "--set", "batch_size=0"], "--set batch_size=0: must be 1..2147483647 or \"max\", got 0"),
    (["run", "{suite}", "--set", "colour=red"], "--set colour=red: unknown key 'colour'"),
    (["run", "{bad}"], "matrix.workload: unknown workload 'resnet9' (did you mean resnet50?)"),
    (["run"], "give a suite file"),
    # a typo gets the name it was meant to be: a key, a value, a command, an option
    (["run", "{suite}", "--set", "batch_sise=4"], "unknown key 'batch_sise' (did you mean batch_size?); expected"),
    (["run", "{suite}", "--set", "framework=pytorch"], "unknown framework 'pytorch' (did you mean torch?)"),
    (["rnu", "{suite}"], "(did you mean run?) (see gpubench --help)"),
    (["run", "{suite}", "--repaets", "3"], "unrecognized arguments: --repaets 3 (did you mean --repeats?)"),
])
def test_bad_input_exits_2_with_one_line_and_leaves_no_run_directory(tmp_path, write_suite, args, message):
    suite = write_suite(FAULTS)
    bad = write_suite("[matrix]\nworkload = ['resnet9']\n", "bad.toml")
    args = [a.format(suite=suite, bad=bad) for a in args]
    proc = run_cli([*args, "--out", str(tmp_path / "runs")], cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_argparse_errors_exit_2(tmp_path):
    proc = run_cli(["run", "x.toml", "--repeats", "0"], cwd=tmp_path)
    assert proc.returncode == 2 and "expected a positive integer" in proc.stderr


def test_bad_plugin_module_is_a_clear_error(tmp_path):
    proc = run_cli(["list"], cwd=tmp_path, env=plugin_env(GPUBENCH_PLUGINS="no_such_plugin_mod"))
    assert proc.returncode == 2
    assert "GPUBENCH_PLUGINS: cannot import plugin module 'no_such_plugin_mod'" in proc.stderr


THREADS = """
name = "threads"
[defaults]
workload = "mlp"
depth = 1
width = 32
batch_size = 16
warmup_steps = 1
steps = 2
windows = 1
threads = 1
telemetry_interval_ms = 0
[matrix]
framework = ["torch", "tensorflow", "fake"]
"""


@pytest.mark.slow
def test_threads_sets_each_frameworks_thread_pools_and_names_the_config(tmp_path, write_suite):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    proc = run_cli(["run", str(write_suite(THREADS)), "--out", str(tmp_path / "runs"), "--no-report"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    found = {r["config"]["framework"]: r for r in result_lines(run_dir)}
    assert found["torch"]["status"] == "ok" and found["torch"]["runtime"]["num_threads"] == 1
    assert found["torch"]["config_id"] == "mlp_depth1_width32-torch-cpu-bs16-fp32-single-threads=1"
    tf_runtime = found["tensorflow"]["runtime"]
    assert found["tensorflow"]["status"] == "ok"
    assert (tf_runtime["intra_op_threads"], tf_runtime["inter_op_threads"]) == (1, 1)
    assert found["fake"]["status"] == "ok"  # the test backend accepts any thread count


def test_a_backend_that_cannot_set_its_threads_makes_the_config_unsupported(monkeypatch):
    from gpubench.backends.base import Backend, Capabilities
    from gpubench.runner import worker
    from gpubench.suite import Config

    class Plain(Backend):
        name = "plain"
        install_hint = "-"
        capabilities = Capabilities(precisions={"cpu": ("fp32",)}, parallelism=("single",))

        def static_unsupported(self, config): return None
        def probe(self): raise NotImplementedError
        def check(self, config): return None
        def build(self, spec, config, batches): raise NotImplementedError
        def is_oom(self, exc): return False

    monkeypatch.setattr(worker, "get_backend", lambda name: Plain())
    from gpubench.results.result import Outcome

    refused = worker.admit(Config(workload="mlp", framework="plain", threads=2))
    admitted = worker.admit(Config(workload="mlp", framework="plain"))
    assert isinstance(refused, Outcome) and refused.status == "unsupported"
    assert refused.reason == "the plain backend cannot set its CPU thread count"
    assert isinstance(admitted, Plain)


def test_huge_pages_go_into_the_workers_environment_and_are_refused_where_thp_is_off(tmp_path, monkeypatch):
    from gpubench import hugepages

    assert hugepages.worker_env("off", {}) == {}
    env = hugepages.worker_env("transparent", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"})
    assert env == {"THP_MEM_ALLOC_ENABLE": "1", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}
    setting = tmp_path / "enabled"
    monkeypatch.setattr(hugepages, "THP_SETTING", setting)
    assert hugepages.unavailable("transparent") == (f"huge_pages = transparent: this system has no transparent huge "
                                                     f"pages ({setting} is missing)")
    setting.write_text("always madvise [never]\n")
    assert hugepages.unavailable("transparent") == (f"huge_pages = transparent: transparent huge pages are off on "
                                                     f"this machine ({setting}: never)")
    assert hugepages.unavailable("off") is None
    setting.write_text("always [madvise] never\n")
    assert hugepages.unavailable("transparent") is None and hugepages.kernel_mode() == "madvise"


@pytest.mark.slow
def test_a_worker_with_huge_pages_holds_its_memory_in_them(tmp_path, write_suite):
    pytest.importorskip("torch")
    from gpubench import hugepages

    suite = write_suite(THREADS.replace('framework = ["torch", "tensorflow", "fake"]',
                                        'framework = "torch"\nhuge_pages = ["transparent", "off"]')
                        .replace("width = 32", "width = 1024").replace("batch_size = 16", "batch_size = 512"))
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--no-report"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    found = {r["config"]["huge_pages"]: r for r in result_lines(run_dir)}
    on = found["transparent"]
    assert on["config_id"].endswith("-threads=1-huge_pages=transparent")
    assert "huge_pages" not in found["off"]["runtime"] and found["off"]["status"] == "ok"
    if hugepages.kernel_mode() in ("always", "madvise"):
        assert on["status"] == "ok" and on["runtime"]["huge_pages"]["setting"] == "transparent"
        assert on["runtime"]["huge_pages"]["anon_huge_bytes"] >= 2 << 20  # at least one 2 MiB page
    else:
        assert on["status"] == "unsupported" and "huge_pages = transparent" in on["reason"]


def test_a_worker_still_running_says_what_it_does(tmp_path, monkeypatch):
    """A config that takes long (here one that hangs in its first step, until its timeout):
    every HEARTBEAT_S a line with the time so far and the phase the worker is in."""
    import gpubench.runner.job as job_module
    from gpubench.config import Config
    from gpubench.runner.job import Job

    for key, value in plugin_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(job_module, "HEARTBEAT_S", 1.0)
    job = Job(Config(framework="fake", workload="fault", workload_params=(("mode", 2),), batch_size=8,
                     timeout_s=5), 0)
    beats: list[str] = []
    outcome = job_module.run_worker(job, tmp_path, heartbeat=beats.append)
    assert outcome.status == "timeout"
    assert len(beats) >= 3 and all(b.startswith(f"  ... {job.name}: ") and " s so far; " in b for b in beats), beats
    assert "; cold start (the first step), for " in beats[-1], beats


def test_prices_by_model_then_kind_and_what_a_bad_price_says(tmp_path):
    """A GPU config is billed for each GPU it trained on, at its model's price, else the kind's;
    a CPU config for each node's machine; a bad price is one line naming the file and key."""
    from gpubench.config import Config
    from gpubench.errors import InputError
    from gpubench.runner.cost import cost_metrics, parse_prices
    from tests.conftest import make_result

    (tmp_path / "p.toml").write_text('"NVIDIA H100 80GB HBM3" = 3.6\ncuda = 1.8\n')
    prices = parse_prices(str(tmp_path / "p.toml"))

    def on(gpu: str, config: Config):
        r = make_result(config, 1000.0)
        r.env = {"frameworks": {"torch": {"devices": [{"name": "cuda:0", "model": gpu}]}}}
        r.duration_s, r.model = 100.0, {"tokens_per_sample": 10}
        return r

    h100 = cost_metrics(on("NVIDIA H100 80GB HBM3", Config("gpt", device="cuda", parallelism="ddp:2")), prices)
    assert (h100["priced_as"], h100["devices_billed"]) == ("NVIDIA H100 80GB HBM3", 2)
    assert h100["per_million_samples"] == pytest.approx(3.6 * 2 / 3600 / 1000 * 1e6)  # 2.0 a million samples
    assert h100["per_million_tokens"] == pytest.approx(0.2) and h100["config"] == pytest.approx(0.2)
    assert cost_metrics(on("NVIDIA L4", Config("gpt", device="cuda")), prices)["priced_as"] == "cuda"
    assert cost_metrics(on("NVIDIA L4", Config("gpt")), prices) is None  # no CPU price in the table
    assert cost_metrics(make_result(Config("mlp", parallelism="ddp:2"), 10.0), parse_prices("0.5"))[
        "devices_billed"] == 1  # the ranks share one CPU
    (tmp_path / "bad.toml").write_text('cpu = "cheap"\n')
    from gpubench.runner.cost import unpriced_lines

    (line,) = unpriced_lines([make_result(Config("mlp"), 10.0)], parse_prices(str(tmp_path / "p.toml")))
    assert line == (f"{tmp_path / 'p.toml'}: no price for cpu: 1 config repeat(s) not priced (the prices are for: "
                    "NVIDIA H100 80GB HBM3, cuda; add the device model, or cpu for any)")
    for text, says in (("0", "--price 0: expected a price per device-hour > 0"),
                       ("", "--price '': expected a price per device-hour > 0"),
                       (str(tmp_path / "bad.toml"), "bad.toml: cpu: expected a price per device-hour > 0, got 'cheap'"),
                       (str(tmp_path / "none.toml"), "neither a number nor a file")):
        with pytest.raises(InputError, match=re.escape(says)):
            parse_prices(text)
