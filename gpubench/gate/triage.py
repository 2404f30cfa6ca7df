"""Triage of a ``regressed`` verdict: what differs between the two sides' results that might
explain it, so a reader can tell a slower machine from slower code.

Three kinds of difference, each from what the results recorded:
- the environment: the fingerprint (CPU model, GPUs and driver, framework versions and CUDA
  builds), and the threads, CPU affinity and Python of each side;
- the telemetry, as the median over each side's repeats: the GPU's SM clock and power (a
  relative change), its utilisation and the share of samples it was throttled (in points),
  and the host's CPU use by the benchmark and by the other processes (in points of a core);
- the phases: results of ``gpubench run`` hold no per-phase times, so the triage gives the
  ``gpubench profile`` command that breaks a step into data, forward, backward and optimizer.

A slower clock, more throttling, a busier machine or a different driver or build points at the
machine; when none is found, the code is the likelier cause. Every line names its figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from gpubench.gate.compare import fingerprint_differences
from gpubench.results.result import Result
from gpubench.results.schema import dig

CLOCK_CHANGE = 0.05  # a relative change of the SM clock or power beyond this is reported
POINTS = 10.0  # a change of a share (utilisation, throttling, host CPU) beyond this many points


def _median(results: list[Result], path: tuple[str, ...]) -> float | None:
    values = [v for r in results if isinstance(v := r.get(*path), (int, float)) and not isinstance(v, bool)]
    return float(statistics.median(values)) if values else None


def _env_lines(base: list[Result], cur: list[Result], labels: tuple[str, str]) -> list[str]:
    a, b = base[0].env or {}, cur[0].env or {}
    frameworks = {r.framework for r in base + cur}
    lines = [f"environment: {d}" for d in fingerprint_differences(a, b, frameworks)]
    pairs: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("CPU affinity", lambda e: e.get("cpu_affinity")),
        ("thread variables", lambda e: {k: v for k, v in (e.get("env_vars") or {}).items() if "THREADS" in k}),
        ("python", lambda e: e.get("python")),
        *((f"{fw} threads", lambda e, fw=fw: dig(e, "frameworks", fw, "build", "num_threads"))
          for fw in sorted(frameworks)),
    ]
    for name, get in pairs:
        if get(a) != get(b):
            lines.append(f"environment: {name}: {get(a)!r} ({labels[0]}) vs {get(b)!r} ({labels[1]})")
    return lines


def _telemetry_lines(base: list[Result], cur: list[Result], labels: tuple[str, str]) -> tuple[list[str], bool]:
    """The telemetry differences, and whether one of them points at the machine."""
    lines, machine = [], False
    for name, path, unit in (("SM clock", ("telemetry", "gpu", "sm_clock_mean_mhz"), "MHz"),
                             ("GPU power", ("telemetry", "gpu", "power_mean_w"), "W")):
        x, y = _median(base, path), _median(cur, path)
        if x and y and abs(y / x - 1) > CLOCK_CHANGE:
            lines.append(f"telemetry: {labels[1]}'s {name} is {100 * abs(y / x - 1):.1f}% "
                         f"{'lower' if y < x else 'higher'} ({y:,.0f} {unit} against {x:,.0f})")
            machine |= name == "SM clock" and y < x
    for name, path, scale, says in (
            ("throttled", ("telemetry", "gpu", "throttled_fraction"), 100.0, "of its GPU samples throttled"),
            ("GPU utilisation", ("telemetry", "gpu", "util_mean"), 1.0, "GPU utilisation"),
            ("benchmark CPU", ("telemetry", "host", "cpu_percent_mean"), 1.0, "CPU used by the benchmark"),
            ("others' CPU", ("telemetry", "host", "others_cores"), 100.0,
             "CPU other processes used (100% = one core)")):
        x, y = _median(base, path), _median(cur, path)
        if x is None or y is None or abs(y - x) * scale <= POINTS:
            continue
        lines.append(f"telemetry: {says}: {scale * y:.0f}% on {labels[1]} against {scale * x:.0f}% on {labels[0]}")
        machine |= (name == "throttled" and y > x) or (name == "others' CPU" and y > x)
    return lines, machine


def triage(base: list[Result], cur: list[Result], config_id: str, labels: tuple[str, str],
           reproduce: str) -> list[str]:
    """What differs between the two sides' ok results of ``config_id``, and a reading of it."""
    b = [r for r in base if r.config_id == config_id and r.ok]
    c = [r for r in cur if r.config_id == config_id and r.ok]
    if not b or not c:
        return []
    env = _env_lines(b, c, labels)
    code = _code_lines(b, c, labels)
    telemetry, machine = _telemetry_lines(b, c, labels)
    hardware = [x for x in env if "GPUs/driver" in x or "cpu_model" in x or " cuda" in x or " cudnn" in x]
    if machine or hardware:
        reading = "the machine, not the code, is the likelier cause: compare again on a quiet, identical machine"
    elif code:
        reading = "the model's code differs (above) and the machine does not: that change is the likelier cause"
    elif env or telemetry:
        reading = "differences above, none of them a slower machine: the code or the setup is the likelier cause"
    else:
        reading = "no difference in the recorded environment or telemetry: the code is the likelier cause"
    profile = (f"phases: not in run results; `python -m gpubench profile SUITE --set ...` on each side breaks "
               f"a step of {config_id} into data, forward, backward and optimizer")
    return [*code, *env, *telemetry, reading, profile, f"reproduce: {reproduce}"]


def _code_lines(base: list[Result], cur: list[Result], labels: tuple[str, str]) -> list[str]:
    """The user's model code each side trained (``model.origin``: a factory's file, its SHA-1
    and git commit), where the two differ."""
    def origin(results: list[Result]) -> dict[str, Any]:
        found = results[0].get("model", "origin")
        return found if isinstance(found, dict) else {}

    a, b = origin(base), origin(cur)
    if not a or not b or a.get("file_sha1") == b.get("file_sha1"):
        return []
    commits = ""
    if a.get("git_commit") and b.get("git_commit"):
        commits = f"; commit {str(a['git_commit'])[:10]} ({labels[0]}) vs {str(b['git_commit'])[:10]} ({labels[1]})"
    return [f"model code: {a.get('module')}.{a.get('function')} differs: {a.get('file')} (sha1 "
            f"{str(a.get('file_sha1'))[:10]}, {labels[0]}) vs {b.get('file')} (sha1 {str(b.get('file_sha1'))[:10]}, "
            f"{labels[1]}){commits}"]
