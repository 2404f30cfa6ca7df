"""The CPU's instruction-set features in the fingerprint, the one-line note on emulated bf16 /
fp16 before a run, and, on this machine's real CPU, that the calibrated bf16 peak is a ceiling
for amp-bf16 training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpubench.env import cpu_features, emulation_note, host_fingerprint, parse_cpuinfo
from gpubench.config import Config
from tests.conftest import plain_env, result_lines, run_cli

# /proc/cpuinfo excerpts (the first processor's lines that matter)
ZEN2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni
"""
ZEN4 = ZEN2.replace("sha_ni", "avx512f avx512dq avx512_vnni avx512_bf16 avx512vl")
SAPPHIRE_RAPIDS = ZEN2.replace("sha_ni", "avx512f avx512_vnni avx512_bf16 avx512_fp16 avx_vnni amx_bf16 amx_tile "
                                         "amx_int8")
GRAVITON2 = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
"""
GRAVITON3 = GRAVITON2.replace("ssbs", "ssbs sve sve2 i8mm bf16 svebf16")


@pytest.mark.parametrize("text, arch, native, present, absent", [
    (ZEN2, "x86", {"bf16": False, "fp16": False}, {"avx2", "fma", "f16c"}, {"avx512f", "avx512_bf16", "amx_bf16"}),
    (ZEN4, "x86", {"bf16": True, "fp16": False}, {"avx512f", "avx512_bf16", "avx512_vnni"}, {"avx512_fp16", "amx_tile"}),
    (SAPPHIRE_RAPIDS, "x86", {"bf16": True, "fp16": True}, {"amx_bf16", "amx_tile", "avx512_fp16", "avx_vnni"},
     {"amx_fp16"}),
    (GRAVITON2, "arm", {"bf16": False, "fp16": True}, {"asimdhp", "fphp", "asimddp"}, {"bf16", "sve"}),
    (GRAVITON3, "arm", {"bf16": True, "fp16": True}, {"bf16", "sve", "sve2", "svebf16", "i8mm"}, set()),
])
def test_cpu_features_from_cpuinfo(text, arch, native, present, absent):
    info = cpu_features(text)
    assert info["cpu_arch"] == arch and info["cpu_native"] == native
    assert {f for f, on in info["cpu_features"].items() if on} >= present
    assert not {f for f, on in info["cpu_features"].items() if on} & absent
    assert absent <= set(info["cpu_features"])  # absent features are listed, as false


def test_unknown_cpuinfo_says_nothing():
    assert parse_cpuinfo("") == (None, set())
    assert cpu_features("") == {"cpu_arch": None, "cpu_features": {}, "cpu_native": {"bf16": None, "fp16": None}}


def test_the_fingerprint_has_this_cpus_features():
    env = host_fingerprint()
    path = Path("/proc/cpuinfo")
    if not path.exists():
        assert env["cpu_native"] == {"bf16": None, "fp16": None}
        return
    _, flags = parse_cpuinfo(path.read_text())
    assert env["cpu_features"] and all(on == (f in flags) for f, on in env["cpu_features"].items())
    assert set(env["cpu_native"]) == {"bf16", "fp16"}


def _configs(*specs: tuple[str, str, str]) -> list[Config]:
    return [Config(workload, device=device, precision=precision) for workload, device, precision in specs]


def test_the_emulation_note_only_where_a_cpu_config_asks_for_what_the_cpu_lacks():
    zen2, zen4, spr = cpu_features(ZEN2), cpu_features(ZEN4), cpu_features(SAPPHIRE_RAPIDS)
    bf16_twice = _configs(("mlp", "cpu", "amp-bf16"), ("cnn", "cpu", "amp-bf16"), ("mlp", "cpu", "fp32"),
                          ("mlp", "cuda", "amp-bf16"))
    repeated = bf16_twice + bf16_twice[:1]  # a config's repeats are one config
    assert emulation_note(repeated, zen2) == (
        "this CPU has no native bf16 (no avx512_bf16/amx_bf16): 2 amp-bf16 CPU configs will run emulated, "
        "often several times slower than fp32")
    assert emulation_note(repeated, zen4) is None and emulation_note(repeated, spr) is None
    assert emulation_note(_configs(("mlp", "cpu", "fp32"), ("mlp", "cuda:1", "amp-bf16")), zen2) is None
    assert emulation_note(bf16_twice, cpu_features("")) is None  # features unknown: no claim
    both = _configs(("mlp", "cpu", "amp-bf16"), ("mlp", "cpu", "amp-fp16"))
    assert emulation_note(both, zen2) == (
        "this CPU has no native bf16 (no avx512_bf16/amx_bf16) or fp16 (no avx512_fp16/amx_fp16): 1 amp-bf16 and "
        "1 amp-fp16 CPU configs will run emulated, often several times slower than fp32")
    assert emulation_note(both, zen4).startswith("this CPU has no native fp16 (no avx512_fp16/amx_fp16): 1 amp-fp16 "
                                                 "CPU config will run")
    assert emulation_note(both, cpu_features(GRAVITON2)).startswith("this CPU has no native bf16 (no bf16): 1 amp-bf16")
    assert emulation_note(both, cpu_features(GRAVITON3)) is None


PROOF_SUITE = """
name = "bf16-ceiling"
[defaults]
workload = "mlp"
device = "cpu"
batch_size = 256
warmup_steps = 1
steps = 3
windows = 2
precision = "amp-bf16"
[matrix]
framework = ["torch", "tensorflow"]
[[matrix.include]]
framework = "torch"
precision = "fp32"
"""


@pytest.mark.slow
def test_a_real_run_notes_emulated_bf16_once_and_its_bf16_peak_is_a_ceiling(tmp_path, write_suite):
    """On this machine's CPU: the note (where the CPU lacks native bf16) is one line on stderr;
    the PyTorch amp-bf16 mlp (the issue's config) achieves no more than the calibrated bf16
    peak (torch.mm's bf16 figure, the peak before, was below it: MFU 150-180% here; the best
    kernel now is several times above it); and no result, TensorFlow's included, shows an MFU
    above 100%. The calibration is the test session's (measured by the first test needing it)."""
    pytest.importorskip("torch")
    suite = write_suite(PROOF_SUITE)
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs"), "--no-report"], cwd=tmp_path,
                   env=plain_env(COLUMNS="250"), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    results = result_lines(run_dir)
    ok = [r for r in results if r["status"] == "ok"]
    bf16 = [r for r in ok if r["config"]["precision"] == "amp-bf16"]
    (torch_bf16,) = [r for r in bf16 if r["config"]["framework"] == "torch"]

    env = json.loads((run_dir / "run.json").read_text())["env"]
    assert env["cpu_native"] == cpu_features()["cpu_native"] and env["cpu_features"] == cpu_features()["cpu_features"]
    notes = [line for line in proc.stderr.splitlines() if line.startswith("gpubench: note:")]
    if env["cpu_native"]["bf16"] is False:
        (line,) = notes
        assert f": {len(bf16)} amp-bf16 CPU config{'s' if len(bf16) > 1 else ''} will run emulated" in line
    else:
        assert notes == []
    assert "gpubench: note:" not in proc.stdout

    m = torch_bf16["metrics"]
    assert "peak_below_achieved" not in m, (m["achieved_tflops"], m["peak"])
    assert 0 < m["mfu"] <= 1 and m["peak_tflops"] >= m["achieved_tflops"] and m["peak"]["precision"] == "bf16"
    assert m["peak"]["kernel"]["framework"] in ("torch", "tensorflow", "jax")  # the best kernel of those calibrated
    flagged = 0
    for r in ok:  # whatever the machine's load did to the figures: never an MFU above 100%
        m = r["metrics"]
        if m["achieved_tflops"] > m["peak_tflops"]:
            assert m["peak_below_achieved"] is True and "mfu" not in m
            flagged += 1
        else:
            assert 0 < m["mfu"] <= 1 and "peak_below_achieved" not in m
    assert proc.stdout.count("above peak") == (flagged + 1 if flagged else 0)  # the cells and the caption


@pytest.mark.parametrize("native_bf16", [False, True])
def test_the_report_says_why_bf16_was_slow_on_a_cpu_without_it(tmp_path, native_bf16):
    """The report and its summary say, once, that a run's amp-bf16 CPU configs ran emulated,
    from the run's own fingerprint (the report may be read far from the machine); nothing
    where the CPU has native bf16."""
    from gpubench.report.build import build_report
    from tests.conftest import make_result

    run = tmp_path / "run"
    run.mkdir()
    env = {"cpu_arch": "x86", "cpu_native": {"bf16": native_bf16, "fp16": False}}
    (run / "run.json").write_text(json.dumps({"run_id": "run", "created_at": "now", "env": env}))
    configs = [Config("mlp", device=d, precision=p, framework=f) for d, p, f in
               (("cpu", "fp32", "torch"), ("cpu", "amp-bf16", "torch"), ("cpu", "amp-bf16", "tensorflow"),
                ("cuda", "amp-bf16", "torch"))]
    results = [make_result(c, run_id="run") for c in configs[:3]] + [make_result(configs[3], status="unavailable")]
    (run / "results.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in results))
    build_report([run], tmp_path / "report")
    summary = (tmp_path / "report" / "summary.md").read_text()
    page = (tmp_path / "report" / "index.html").read_text()
    line = ("this CPU has no native bf16 (no avx512_bf16/amx_bf16): 2 amp-bf16 CPU configs ran emulated, "
            "often several times slower than fp32")
    if native_bf16:
        assert "emulated" not in summary and "emulated" not in page
    else:
        assert summary.count(line) == 1 and f"> note: {line}" in summary
        assert page.count(f"Note: {line}.") == 1
