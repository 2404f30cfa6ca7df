"""Telemetry without a GPU: a fake NVML, scripted samples, the sampler thread, the null path."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from gpubench.measure.loop import Phase
from gpubench.telemetry.base import GpuSample, HostSample, PeriodicSampler
from gpubench.telemetry.host import Totals
from gpubench.telemetry.nvml import NvmlReader, nvml_index, unofficial_pynvml_problem
from gpubench.telemetry.session import TelemetrySession
from gpubench.telemetry.summary import gpu_energy, gpu_summary, host_summary, windows_of
from tests.conftest import plugin_env, result_lines, run_cli
from tests.fake_nvml import FakeDevice, FakeNVML

UUIDS = ["GPU-aaaa1111-0000", "GPU-bbbb2222-0000", "GPU-cccc3333-0000"]


@pytest.mark.parametrize("ordinal, uuid, visible, expected", [
    (0, None, None, 0),
    (2, None, None, 2),
    (0, None, "2,0", 2),
    (1, None, "2,0", 0),
    (0, None, "GPU-bbbb", 1),  # UUID prefix
    (1, None, "1,7,2", None),  # CUDA stops at the first invalid entry
    (0, None, "MIG-1234", None),
    (0, None, "", None),  # no device visible
    (0, "bbbb2222-0000", "0", 1),  # the framework's UUID wins
    (0, "GPU-cccc3333-0000", None, 2),
])
def test_cuda_ordinal_to_nvml_index(ordinal, uuid, visible, expected):
    assert nvml_index(ordinal, uuid, UUIDS, visible) == expected


def test_reader_fields_and_unsupported_ones():
    dev = FakeDevice(UUIDS[0], unsupported={"temperature", "pstate"})
    reader = NvmlReader(FakeNVML([dev]), [0])
    assert reader.power_source == "instant"
    (s,) = reader.read()
    assert (s.util_gpu_pct, s.util_mem_pct, s.mem_used_bytes, s.power_w) == (90, 40, 10 << 30, 310.0)
    assert s.sm_clock_mhz == 1980 and s.mem_clock_mhz == 2619 and s.energy_mj == 1000
    assert s.temp_c is None and s.pstate is None  # only the unsupported fields are missing
    assert set(reader.errors) == {"temperature", "pstate"} and "Not Supported" in reader.errors["pstate"]


def test_reader_falls_back_to_average_power():
    reader = NvmlReader(FakeNVML([FakeDevice(UUIDS[0], instant_mw=None)]), [0])
    assert reader.power_source == "average"
    assert reader.read()[0].power_w == 300.0


def test_sampler_keeps_a_steady_rate_and_survives_errors():
    calls = []

    def read():
        calls.append(time.monotonic())
        if len(calls) % 3 == 0:
            raise RuntimeError("flaky device")
        return [len(calls)]

    sampler = PeriodicSampler("t", 0.02, read).start()
    time.sleep(0.5)
    samples = sampler.stop()
    assert 18 <= len(calls) <= 32  # ~25 periods, plus the final read
    assert sampler.error_count >= 5 and len(sampler.errors) == PeriodicSampler.MAX_ERRORS
    assert all(isinstance(x, int) for x in samples)
    gaps = [b - a for a, b in zip(calls, calls[1:-1])]
    assert abs(sum(gaps) / len(gaps) - 0.02) < 0.01  # no drift from the read's own cost


def gs(t_ms, **kw):
    return GpuSample(t_ns=int(t_ms * 1e6), index=0, **kw)


def test_gpu_summary_over_windows_only():
    phases = [Phase("cold_start", 0, int(10e6)), Phase("warmup", int(10e6), int(100e6)),
              Phase("window_0", int(100e6), int(200e6)), Phase("window_1", int(200e6), int(300e6))]
    windows = windows_of(phases)
    samples = [gs(50, util_gpu_pct=5, power_w=80, temp_c=40, clock_event_reasons=1)]  # warm-up: excluded
    samples += [gs(100 + 10 * i, util_gpu_pct=90 + i % 5, power_w=300, mem_used_bytes=1000 + i, temp_c=60 + i % 3,
                   sm_clock_mhz=1900, clock_event_reasons=4 if i < 5 else 0) for i in range(20)]
    counters = [([1000], [31000]), ([31000], [61000])]  # 30 J per window
    g = gpu_summary(samples, windows, counters, samples_measured=600, power_source="instant", averaging_s=0.05)
    assert g["samples"] == 20
    assert g["util_mean"] == pytest.approx(92.0) and g["util_p95"] == pytest.approx(94.0)
    assert g["power_mean_w"] == 300 and g["temp_max_c"] == 62 and g["mem_used_peak_bytes"] == 1019
    assert g["energy_j"] == pytest.approx(60.0) and g["energy_source"] == "counter"
    assert g["energy_per_sample_j"] == pytest.approx(0.1)
    assert g["throttled_fraction"] == pytest.approx(0.25)


def test_short_windows_report_no_utilisation_or_energy():
    # the quick suite's JAX MLP on an H200: five 12 ms windows; NVML printed 0.0% and 0 J for it
    windows = [(int(1e9) + k * int(13e6), int(1e9) + k * int(13e6) + int(12e6)) for k in range(5)]
    samples = [gs(1000 + 13 * k + 5, util_gpu_pct=0, power_w=130.0) for k in range(5)]
    counters = [([5_000], [5_000])] * 5  # the counter did not move inside any window
    g = gpu_summary(samples, windows, counters, samples_measured=5 * 50 * 256, power_source="instant")
    assert g["util_mean"] is None and g["util_p95"] is None and g["mem_util_mean"] is None
    assert g["energy_j"] is None and g["energy_per_sample_j"] is None
    assert g["devices"][0]["util_mean"] is None and g["devices"][0]["energy_j"] is None
    assert "span 0.064 s" in g["not_reported"]["utilisation"]
    assert "last 0.06 s in all" in g["not_reported"]["energy"]
    assert g["power_mean_w"] == 130.0 and g["samples"] == 5  # instant readings stay


def test_utilisation_counts_only_readings_whose_period_is_inside_the_windows():
    # 2 s of windows after an idle warm-up: the readings of the first second still see the warm-up
    windows = [(0, int(1e9)), (int(1e9), int(2e9))]
    samples = [gs(t, util_gpu_pct=u) for t, u in ((100, 5), (500, 40), (1000, 95), (1500, 97), (1900, 99))]
    g = gpu_summary(samples, windows, [([0], [300_000]), ([300_000], [600_000])], 100, "instant")
    assert g["util_mean"] == pytest.approx(97.0) and g["samples"] == 5
    assert g["energy_j"] == pytest.approx(600.0) and g["not_reported"] == {}


def test_a_counter_that_does_not_advance_in_a_window_gives_no_energy():
    windows = [(0, int(1e9)), (int(1e9), int(2e9))]
    g = gpu_summary([gs(1500, util_gpu_pct=90)], windows, [([0], [300_000]), ([300_000], [300_000])], 100,
                    "instant")
    assert g["energy_j"] is None and "did not advance" in g["not_reported"]["energy"]
    assert g["util_mean"] == 90


def test_energy_falls_back_to_integrated_power():
    windows = [(0, int(1e9)), (int(2e9), int(4e9))]
    samples = [gs(t, power_w=p) for t, p in ((100, 100.0), (900, 300.0), (2500, 250.0), (3500, 250.0))]
    energy, source = gpu_energy(samples, windows, [([None], [None])] * 2, "average")
    assert energy == pytest.approx(200.0 * 1 + 250.0 * 2) and source == "power_integration (average)"
    energy, _ = gpu_energy(samples[:2], windows, [], "instant")
    assert energy is None  # a window without any power sample: no figure rather than a wrong one


def test_host_summary():
    windows = [(0, int(1e9))]
    samples = [HostSample(int(t * 1e6), cpu_percent=c, rss_bytes=r, system_cpu_percent=50.0)
               for t, c, r in ((-5, 0.0, 1), (100, 180.0, 500), (600, 200.0, 700))]
    h = host_summary(samples, windows)
    assert h == {"cpu_percent_mean": 190.0, "cpu_percent_max": 200.0, "rss_peak_bytes": 700,
                 "system_cpu_percent_mean": 50.0, "samples": 2}
    # over the windows' span (1 s): the machine 3.8 of 4 cores busy, the worker tree 1.5 of them
    span = (Totals(0, 10.0, 100.0, 400.0, 4), Totals(int(1e9), 11.5, 103.8, 404.0, 4))
    h = host_summary(samples, windows, span)
    assert h["machine_busy_pct"] == pytest.approx(95.0) and h["others_cores"] == pytest.approx(2.3)
    assert h["shared_cores"] is True and h["cores"] == 4 and h["span_s"] == 1.0


def session_run(nvml, device="cuda:0", uuid=None, ordinals=None, nodes=1):
    uuids = [uuid] if isinstance(uuid, str) else (uuid or [])
    # 0.6 s of windows: the fakes average over 0.1 s (a real NVML over up to 1 s)
    session = TelemetrySession(device, 10, uuids, nvml=nvml, ordinals=ordinals, nodes=nodes,
                               averaging_s=0.1).start()
    t0 = time.perf_counter_ns()
    phases = [Phase("cold_start", t0, t0 + 1)]
    for w in range(2):
        session.on_phase(f"window_{w}", "start")
        a = time.perf_counter_ns()
        time.sleep(0.3)  # 0.6 s of windows: >= 2 host samples (every 250 ms) inside
        b = time.perf_counter_ns()
        session.on_phase(f"window_{w}", "end")
        phases.append(Phase(f"window_{w}", a, b))
    return session.stop(phases, samples_measured=100)


def test_session_with_a_fake_gpu():
    nvml = FakeNVML([FakeDevice(UUIDS[0]), FakeDevice(UUIDS[1], name="Second")])
    summary, timeline = session_run(nvml, "cuda:0", uuid="bbbb2222-0000")  # the framework's UUID -> NVML 1
    g = summary["gpu"]
    assert g["index"] == 1 and g["name"] == "Second" and g["uuid"] == UUIDS[1]
    assert g["energy_source"] == "counter" and g["energy_j"] > 0
    assert g["energy_per_sample_j"] == pytest.approx(g["energy_j"] / 100)
    assert g["util_mean"] == 90 and g["samples"] >= 30
    assert summary["gpu_reason"] is None and summary["host"]["samples"] >= 2
    assert summary["host_interval_ms"] == 250 and summary["interval_ms"] == 10
    assert [p["name"] for p in timeline["phases"]] == ["cold_start", "window_0", "window_1"]
    assert timeline["gpu"] and all("t_ms" in s for s in timeline["gpu"])


def test_the_energy_counter_a_run_to_a_target_reads_sums_the_configs_gpus(monkeypatch):
    """TelemetrySession.energy_j (energy_to_target_j's reading): every sampled device's NVML
    counter, in J, summed; None without a GPU."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    nvml = FakeNVML([FakeDevice(UUIDS[0], energy_per_read_mj=1000), FakeDevice(UUIDS[1], energy_per_read_mj=3000)])
    session = TelemetrySession("cuda", 10, [], nvml=nvml, ordinals=[0, 1], averaging_s=0.1)
    first, second = session.energy_j(), session.energy_j()
    assert first is not None and second - first == pytest.approx(4.0)  # 1 J and 3 J a read
    assert TelemetrySession("cpu", 10, []).energy_j() is None


def test_session_samples_every_gpu_the_config_uses(monkeypatch):
    # ddp:2 / dp:2 / pipeline:2 on cuda:0 and cuda:1, which CUDA_VISIBLE_DEVICES maps to NVML 2 and 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    nvml = FakeNVML([FakeDevice(UUIDS[0], util=60, mem_used=5 << 30, instant_mw=200_000),
                     FakeDevice(UUIDS[1], util=0, instant_mw=50_000),  # not the config's: never sampled
                     FakeDevice(UUIDS[2], name="Third", util=100, mem_used=7 << 30, energy_per_read_mj=3000)])
    summary, timeline = session_run(nvml, "cuda", ordinals=[0, 1])
    g = summary["gpu"]
    assert [d["index"] for d in g["devices"]] == [2, 0] and g["count"] == 2 and g["index"] == 2
    assert [d["name"] for d in g["devices"]] == ["Third", "Fake GPU"] and g["uuid"] == UUIDS[2]
    assert {s["index"] for s in timeline["gpu"]} == {0, 2}
    third, first = g["devices"]
    assert (third["util_mean"], first["util_mean"]) == (100, 60) and g["util_mean"] == pytest.approx(80)
    assert g["mem_used_peak_bytes"] == 7 << 30  # the fullest device
    assert g["power_mean_w"] == pytest.approx(310.0 + 200.0)  # the config's draw: both devices
    # every read advances a fake counter by 3000 or 1000 mJ, and both are read together
    assert g["energy_source"] == "counter" and first["energy_j"] > 0
    assert third["energy_j"] == pytest.approx(3 * first["energy_j"])
    assert g["energy_j"] == pytest.approx(4 * first["energy_j"])
    assert g["energy_per_sample_j"] == pytest.approx(g["energy_j"] / 100)
    assert g["scope"] == "this config's 2 GPUs"


def test_multi_node_energy_per_sample_uses_this_nodes_share():
    summary, _ = session_run(FakeNVML([FakeDevice(UUIDS[0]), FakeDevice(UUIDS[1])]), "cuda", ordinals=[0, 1],
                             nodes=2)
    g = summary["gpu"]
    assert g["energy_j"] == pytest.approx(sum(d["energy_j"] for d in g["devices"])) and g["energy_j"] > 0
    assert g["energy_per_sample_j"] == pytest.approx(g["energy_j"] / 50)  # node 0 trained half of the 100 samples
    assert g["scope"].startswith("node 0's 2 GPUs of 4")


def test_an_unmappable_gpu_of_several_is_named(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    summary, _ = session_run(FakeNVML([FakeDevice(UUIDS[0]), FakeDevice(UUIDS[1])]), "cuda", ordinals=[0, 1])
    assert summary["gpu"] is None and summary["gpu_reason"] == "cannot map cuda:1 to an NVML device " \
        "(CUDA_VISIBLE_DEVICES='1')"


def test_integrated_energy_per_device():
    windows = [(0, int(1e9))]
    samples = [GpuSample(t_ns=int(t * 1e6), index=i, power_w=p)
               for t, i, p in ((100, 0, 100.0), (100, 3, 300.0), (900, 0, 200.0), (900, 3, 300.0))]
    g = gpu_summary(samples, windows, [([None, None], [None, None])], 10, "instant", devices=[3, 0])
    assert [d["energy_j"] for d in g["devices"]] == [pytest.approx(300.0), pytest.approx(150.0)]
    assert g["energy_j"] == pytest.approx(450.0) and g["energy_source"] == "power_integration (instant)"
    assert g["power_mean_w"] == pytest.approx(450.0)
    # a device without a power sample in a window: no total rather than a partial one
    g = gpu_summary(samples[1::2], windows, [], 10, "instant", devices=[3, 0])
    assert g["devices"][0]["energy_j"] == pytest.approx(300.0) and g["devices"][1]["energy_j"] is None
    assert g["energy_j"] is None and g["energy_per_sample_j"] is None


def test_a_failing_device_costs_only_the_gpu_telemetry():
    summary, _ = session_run(FakeNVML([FakeDevice(UUIDS[0], broken=True)]))
    assert summary["gpu"] is None and "GPU is lost" in summary["gpu_reason"]
    assert summary["host"]["samples"] > 0


def test_no_energy_counter_integrates_power():
    summary, _ = session_run(FakeNVML([FakeDevice(UUIDS[0], energy_per_read_mj=None, instant_mw=None)]))
    g = summary["gpu"]
    assert g["energy_source"] == "power_integration (average)"
    assert g["energy_j"] == pytest.approx(300.0 * 0.6, rel=0.2)  # 300 W over 0.6 s of windows
    assert "energy_mj" in g["unsupported_fields"]


def test_cpu_config_has_no_gpu_telemetry():
    summary, timeline = session_run(None, device="cpu")
    assert summary["gpu"] is None and summary["gpu_reason"] == "not a GPU config"
    assert summary["host"]["cpu_percent_mean"] is not None and timeline["gpu"] == []


def test_unofficial_pynvml_is_detected(monkeypatch):
    import importlib.metadata as md

    class Dist:
        files = ["pynvml.py"]

    def distribution(name):
        if name == "pynvml":
            return Dist()
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", distribution)
    assert "pip uninstall -y pynvml && pip install nvidia-ml-py" in unofficial_pynvml_problem()


def test_run_records_host_telemetry_a_timeline_and_cores_it_shared(tmp_path, write_suite):
    """A config measured while other processes keep every core busy is flagged ``shared`` in its
    result, its terminal line, the summary and the report."""
    import psutil

    suite = write_suite("""
[defaults]
framework = "fake"
workload = "fault"
batch_size = 8
steps = 100
windows = 2
[telemetry]
interval_ms = 20
[matrix]
device = ["cpu"]
""")
    cores = psutil.cpu_count()
    # at the lowest priority: they take only the CPU gpubench leaves, which keeps the test fast
    hogs = [subprocess.Popen([sys.executable, "-c", "import os; os.nice(19)\nwhile True: pass"]) for _ in range(cores)]
    try:
        proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs")], cwd=tmp_path,
                       env=plugin_env(FAKE_STEP_SLEEP_MS="5"))  # 2 windows of 100 steps of 5 ms
    finally:
        for h in hogs:
            h.kill()
            h.wait()

    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    (r,) = result_lines(run_dir)
    t = r["telemetry"]
    assert r["config"]["telemetry_interval_ms"] == 20 and t["interval_ms"] == 20
    assert t["host_interval_ms"] == 250  # the host sampler's floor (HOST_MIN_INTERVAL_MS)
    assert t["gpu"] is None and t["gpu_reason"] == "not a GPU config"
    # >= 1 s of windows at one host sample per 250 ms
    assert t["host"]["rss_peak_bytes"] > 0 and 3 <= t["host"]["samples"] <= 6
    timeline = json.loads((run_dir / t["timeline"]).read_text())
    assert [p["name"] for p in timeline["phases"]][-1] == "window_1" and timeline["host"]
    # the hogs are other processes: the sleeping worker shared the machine with them
    host = t["host"]
    assert host["cores"] == cores and host["others_cores"] >= 0.5 * cores and host["shared_cores"] is True
    assert host["span_s"] >= 1.0 and host["machine_busy_pct"] >= 90
    assert "(shared cores: other processes used" in proc.stdout and " shared " in proc.stdout
    warning = "1 of 1 measured configs shared their cores with other processes"
    assert warning in proc.stderr
    (report,) = (tmp_path / "reports").iterdir()
    assert warning in (report / "summary.md").read_text()
    html = (report / "index.html").read_text()
    assert warning in html and "<h3>Shared cores</h3>" in html and "cores other processes used" in html


def test_others_are_every_process_outside_the_workers_tree():
    """The same busy child is the worker's own CPU to a reader rooted at its parent, and another
    process's to a reader rooted elsewhere (what keeps a config's ranks and data workers out of
    its contention)."""
    from gpubench.telemetry.host import HostReader

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        mine, elsewhere = HostReader(tree_refresh_s=0.0), HostReader(idle.pid, tree_refresh_s=0.0)
        time.sleep(0.6)
        (a,) = mine.read()
        (b,) = elsewhere.read()
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
    assert a.cpu_percent >= 25 and b.cpu_percent < 10  # the busy child is in the first tree only
    assert b.others_cpu_percent - a.others_cpu_percent >= 25


def test_shared_cores_rule():
    from gpubench.telemetry.contention import shared_cores

    assert shared_cores(1.0, 95.0, 2) is True
    assert shared_cores(1.0, 60.0, 2) is False  # cores to spare: nobody waited
    assert shared_cores(0.1, 99.0, 2) is False  # the config itself filled the machine
    assert shared_cores(0.5, 99.0, 64) is False  # under 5% of 64 cores
    assert shared_cores(None, 99.0, 2) is None
    # windows too short for the 10 ms ticks: no figure, and the reason
    span = (Totals(0, 1.0, 10.0, 20.0, 2), Totals(int(0.05e9), 1.0, 10.1, 20.1, 2))
    h = host_summary([], [(0, int(0.05e9))], span)
    assert h["others_cores"] is None and h["shared_cores"] is None and "span 0.05 s, under the 0.1 s" in h["others_reason"]


def test_telemetry_off(tmp_path, write_suite):
    suite = write_suite('[defaults]\nframework = "fake"\nworkload = "fault"\nsteps = 2\nwindows = 1\n'
                        'telemetry_interval_ms = 0\n')
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--no-report"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    (r,) = result_lines(run_dir)
    assert r["telemetry"]["gpu_reason"] == "telemetry off (telemetry_interval_ms = 0)"
    assert not (run_dir / "telemetry").exists()


def test_cli_interval_override_and_bad_values(tmp_path, write_suite):
    suite = write_suite('[defaults]\nframework = "fake"\nworkload = "fault"\nsteps = 2\nwindows = 1\n'
                        '[telemetry]\ninterval_ms = 50\n')
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--no-report", "--telemetry-interval-ms", "0"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    (r,) = result_lines(run_dir)
    assert r["config"]["telemetry_interval_ms"] == 0  # the flag wins over the suite's 50
    assert r["telemetry"]["gpu_reason"] == "telemetry off (telemetry_interval_ms = 0)"
    bad = run_cli(["run", str(suite), "--out", str(tmp_path / "bad"), "--telemetry-interval-ms", "-5"], cwd=tmp_path)
    assert bad.returncode == 2 and "telemetry_interval_ms" in bad.stderr and not (tmp_path / "bad").exists()
    bad = run_cli(["run", str(suite), "--out", str(tmp_path / "bad"), "--telemetry-interval-ms", "fast"], cwd=tmp_path)
    assert bad.returncode == 2 and "--telemetry-interval-ms" in bad.stderr


def test_host_reader_leaves_out_cpu_over_too_short_an_interval():
    from gpubench.telemetry.host import HostReader

    reader = HostReader()
    (first,) = reader.read()  # right after priming: no meaningful CPU figure
    assert first.cpu_percent is None and first.system_cpu_percent is None and first.rss_bytes > 0
    end = time.perf_counter() + 0.15
    while time.perf_counter() < end:  # keep this process busy
        sum(i * i for i in range(1000))
    (busy,) = reader.read()
    assert busy.cpu_percent is not None and busy.cpu_percent > 20  # one busy thread: near 100 when idle
    assert busy.system_cpu_percent is not None and busy.rss_bytes > 0


def test_host_reader_drops_a_reading_delayed_in_the_middle():
    """A reading whose /proc snapshot took long (the sampler thread waited for the GIL) must not
    put the CPU time of the wait on a short interval."""
    from gpubench.telemetry.host import HostReader

    # clock calls: per snapshot (the constructor's first) its start, the tree, its end
    ticks = iter([0, 0, 0,
                  300_000_000, 300_000_000, 310_000_000,  # a reading at 0.3 s taking 10 ms: kept
                  600_000_000, 600_000_000, 900_000_000])  # one taking 300 ms of a 590 ms interval: dropped
    reader = HostReader(tree_refresh_s=100.0, clock=lambda: next(ticks))
    (kept,) = reader.read()
    (dropped,) = reader.read()
    assert kept.cpu_percent is not None and kept.cpu_percent >= 0
    assert dropped.cpu_percent is None and dropped.system_cpu_percent is None and dropped.rss_bytes > 0


def test_the_fake_nvml_matches_nvidias_bindings():
    # every call and constant the fake stands in for exists in nvidia-ml-py, with the same values,
    # and the structures gpubench reads have the fields it reads
    import pynvml

    from gpubench.telemetry import nvml as gn

    names = [n for n in dir(FakeNVML) if n.startswith(("nvml", "NVML"))]
    assert len(names) > 15 and [n for n in names if not hasattr(pynvml, n)] == []
    assert all(getattr(FakeNVML, n) == getattr(pynvml, n) for n in names if n.startswith("NVML_"))
    assert gn.FI_POWER_INSTANT == pynvml.NVML_FI_DEV_POWER_INSTANT
    assert gn.THROTTLE_MASK == (pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwSlowdown
                                | pynvml.nvmlClocksEventReasonSwThermalSlowdown
                                | pynvml.nvmlClocksEventReasonHwThermalSlowdown
                                | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown)
    fields = lambda struct: {name for name, _ in struct._fields_}  # noqa: E731
    assert {"nvmlReturn", "value"} <= fields(pynvml.c_nvmlFieldValue_t) and "uiVal" in fields(pynvml.c_nvmlValue_t)
    assert {"gpu", "memory"} <= fields(pynvml.c_nvmlUtilization_t)
    assert {"pid", "usedGpuMemory"} <= fields(pynvml.c_nvmlProcessInfo_t)  # the clean-machine check reads these
    # GPM: the structures gpubench fills and reads, and the metric ids of each figure
    assert {"version", "numMetrics", "sample1", "sample2", "metrics"} <= fields(pynvml.c_nvmlGpmMetricsGet_t)
    assert {"metricId", "nvmlReturn", "value"} <= fields(pynvml.c_nvmlGpmMetric_t)
    assert "isSupportedDevice" in fields(pynvml.c_nvmlGpmSupport_t)
    ids = {"sm_active_pct": "SM_UTIL", "sm_occupancy_pct": "SM_OCCUPANCY", "tensor_active_pct": "ANY_TENSOR_UTIL",
           "tensor_hmma_pct": "HMMA_TENSOR_UTIL", "dram_bw_pct": "DRAM_BW_UTIL", "fp32_pct": "FP32_UTIL",
           "fp16_pct": "FP16_UTIL", "pcie_tx_mib_s": "PCIE_TX_PER_SEC", "pcie_rx_mib_s": "PCIE_RX_PER_SEC",
           "nvlink_tx_mib_s": "NVLINK_TOTAL_TX_PER_SEC", "nvlink_rx_mib_s": "NVLINK_TOTAL_RX_PER_SEC"}
    assert gn.GPM_METRICS == {f: getattr(pynvml, f"NVML_GPM_METRIC_{n}") for f, n in ids.items()}
    assert {"used", "total"} <= fields(pynvml.c_nvmlMemory_t)


@pytest.mark.skipif(__import__("os").path.exists("/dev/nvidiactl"), reason="this machine has an NVIDIA driver")
def test_real_nvml_without_a_driver_is_a_reason_not_a_crash():
    summary, _ = session_run(None, "cuda:0")  # the real bindings, on a machine without a driver
    assert summary["gpu"] is None and summary["gpu_reason"].startswith("NVML unavailable: ")
    assert summary["host"]["samples"] > 0


def test_the_clean_machine_check_reads_each_finding_and_none_on_a_clean_gpu():
    """gpu_inventory records each GPU's state; machine_findings says one line per finding: other
    processes (own pids left out), persistence off, MIG on, a lowered power limit, set
    application clocks, ECC errors, a pending retirement; nothing on a clean GPU, and a field a
    GPU does not report is None, never a finding."""
    from gpubench.telemetry.nvml import gpu_inventory, machine_findings

    clean = FakeDevice(UUIDS[0], name="Clean")
    busy = FakeDevice(UUIDS[1], name="Busy", processes=[(4242, 3 << 30), (777, 1 << 30)], persistence=0,
                      mig=(1, 1), power_limit_mw=500_000, app_clock=1500, ecc_uncorrected=2,
                      remapped_rows=(0, 0, 1, 0))
    mute = FakeDevice(UUIDS[2], name="Mute", unsupported={"processes", "persistence", "mig", "power_limit",
                                                           "app_clock", "ecc", "retired_pages", "remapped_rows"})
    gpus, reason = gpu_inventory(FakeNVML([clean, busy, mute]))
    assert reason is None and [g["name"] for g in gpus] == ["Clean", "Busy", "Mute"]
    assert gpus[1]["state"]["processes"][0] == {"pid": 4242, "used_memory_bytes": 3 << 30, "name": None}
    assert gpus[1]["state"]["power_limit_w"] == 500.0 and gpus[1]["state"]["remapped_rows_pending"] is True
    assert gpus[2]["state"]["processes"] == [] and all(v is None for k, v in gpus[2]["state"].items()
                                                        if k != "processes")
    lines = machine_findings(gpus, own_pids=frozenset({777}))
    assert [line.split(":")[0] for line in lines] == ["GPU 1 (Busy)"] * 7
    assert lines[0].startswith("GPU 1 (Busy): 1 other process(es) use it (pid 4242 (3.0 GiB))")
    assert "persistence mode is off" in lines[1] and "MIG is on" in lines[2]
    assert "power limit 500 W is below its default 700 W" in lines[3]
    assert "application clocks are set to 1500 MHz (default 1980 MHz)" in lines[4]
    assert "2 uncorrected ECC error(s)" in lines[5] and "waits for a GPU reset" in lines[6]
    assert machine_findings(gpus[:1]) == [] and machine_findings(gpus[2:]) == []


def test_require_idle_gpu_refuses_a_gpu_the_sweep_uses_when_another_process_does(monkeypatch, capsys):
    """The check looks at the GPUs the CUDA configs train on (through CUDA_VISIBLE_DEVICES):
    a finding is a warning; with --require-idle-gpu another process is exit 2 naming it."""
    from gpubench.errors import InputError
    from gpubench.runner.run import clean_machine_check, used_gpus
    from gpubench.suite import Config

    def gpu(index, pid):
        return {"index": index, "name": f"G{index}", "uuid": f"GPU-{index}",
                "state": {"processes": [{"pid": pid, "used_memory_bytes": None, "name": "python"}]}}

    env = {"gpus": [gpu(0, 99999), gpu(1, 5)]}
    on_cuda = [Config(workload="mlp", device="cuda")]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(InputError, match=r"^--require-idle-gpu: other processes use the GPUs this sweep trains on "
                                         r"\(GPU 0: pid 99999 python\)"):
        clean_machine_check(on_cuda, env, require_idle=True)
    clean_machine_check(on_cuda, env, require_idle=False)
    err = capsys.readouterr().err
    assert "GPU 0 (G0): 1 other process(es) use it (pid 99999 python)" in err and "G1" not in err
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # cuda:0 is the second GPU
    with pytest.raises(InputError, match=r"\(GPU 1: pid 5 python\)"):
        clean_machine_check(on_cuda, env, require_idle=True)
    assert "GPU 1 (G1)" in capsys.readouterr().err
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    two_nodes = Config(workload="mlp", device="cuda", parallelism="ddp:1", nnodes=2)  # this node's cuda:0 only
    assert [g["index"] for g in used_gpus([two_nodes], env["gpus"])] == [0]
    capsys.readouterr()
    clean_machine_check([Config(workload="mlp", device="cpu")], env, require_idle=True)  # no GPU config: no check
    assert capsys.readouterr().err == ""


def test_gpm_counters_are_read_between_samples_and_averaged_over_the_windows():
    """With GPM (Hopper and later) each sample carries the metrics since the previous one; the
    summary averages the samples whose period lies inside the measured windows; a metric the
    GPU does not serve is None, never 0; no GPM on the GPU is a reason, never a failure; every
    GPM sample is freed."""
    from gpubench.telemetry.base import GpuSample
    from gpubench.telemetry.nvml import NvmlReader
    from gpubench.telemetry.summary import gpu_summary

    nvml = FakeNVML([FakeDevice(UUIDS[0], gpm={2: 91.0, 5: 80.3, 7: 78.0, 10: 33.0})])
    reader = NvmlReader(nvml, [0])
    (sample,) = reader.read()
    assert reader.gpm_reason is None and sample.gpm_period_ns is not None and sample.gpm_period_ns >= 0
    assert (sample.sm_active_pct, sample.tensor_active_pct, sample.tensor_hmma_pct, sample.dram_bw_pct) == (
        91.0, 80.3, 78.0, 33.0)
    assert sample.fp16_pct is None and "gpm fp16_pct" in reader.errors  # not served: None, with why
    reader.close()
    assert nvml.gpm_samples == set()

    failing = FakeNVML([FakeDevice(UUIDS[0], gpm={5: 1.0})])
    broken = NvmlReader(failing, [0])
    failing.devices[0].unsupported.add("gpm")  # every later GPM sample fails: no leak, no failure
    assert broken.read()[0].tensor_active_pct is None and "gpm" in broken.errors
    broken.close()
    assert failing.gpm_samples == set()

    none = NvmlReader(FakeNVML([FakeDevice(UUIDS[0])]), [0])
    assert none.gpm_reason == "the GPU does not support NVML's GPM metrics (Hopper or newer does)"
    assert none.read()[0].tensor_active_pct is None

    ms = 1_000_000
    windows = [(1000 * ms, 2000 * ms)]

    def s(t_ms, period_ms, tensor):
        return GpuSample(t_ns=t_ms * ms, index=0, gpm_period_ns=period_ms * ms, tensor_active_pct=tensor)

    # the first reading's period began before the window: left out; the rest averaged
    samples = [s(1050, 100, 5.0), s(1150, 100, 60.0), s(1250, 100, 80.0), s(1950, 100, 70.0)]
    summary = gpu_summary(samples, windows, [], 100.0, "average", [0])
    assert summary["tensor_active_pct_mean"] == pytest.approx(70.0) and "gpm" not in summary["not_reported"]
    assert summary["devices"][0]["tensor_active_pct_mean"] == pytest.approx(70.0)
    short = gpu_summary(samples[:1], windows, [], 100.0, "average", [0])
    assert short["tensor_active_pct_mean"] is None and short["not_reported"]["gpm"].startswith("no GPM reading")
    told = gpu_summary(samples, windows, [], 100.0, "average", [0], gpm_reason="the GPU does not support it")
    assert told["not_reported"]["gpm"] == "the GPU does not support it"
