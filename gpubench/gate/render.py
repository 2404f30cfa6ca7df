"""A comparison as a terminal table, markdown (CI job summary), JUnit XML and JSON."""

from __future__ import annotations

import math
import re
import statistics
import xml.etree.ElementTree as ET
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from gpubench import fmt
from gpubench.gate.compare import Comparison, ConfigVerdict, GateOptions
from gpubench.gate.triage import triage
from gpubench.results.metrics import Metric
from gpubench.results.result import Result

STYLE = {"regressed": "red", "improved": "green", "unchanged": "", "inconclusive": "yellow", "missing": "magenta",
         "new": "cyan"}


def change_text(ratio: float | None, low: float | None, high: float | None) -> str:
    """``-8.2% [-9.1%, -7.3%]``: a ratio as a change, with its interval where it has one (None or
    NaN bounds: none)."""
    if ratio is None:
        return "-"
    text = f"{100 * (ratio - 1):+.1f}%"
    if low is not None and high is not None and not (math.isnan(low) or math.isnan(high)):
        text += f" [{100 * (low - 1):+.1f}%, {100 * (high - 1):+.1f}%]"
    return text


def compare_command(baseline: str, current: str, o: GateOptions, force: bool) -> str:
    """The ``gpubench compare`` command, every gate option spelled out, that gives the same
    verdicts from the same results."""
    return (f"python -m gpubench compare {baseline} {current} --threshold {100 * o.threshold:g}% --noise-floor "
            f"{100 * o.noise_floor:g}% --alpha {o.alpha:g} --correction {o.correction} --metric {o.metric}"
            + (f" --best-of {o.best_of}" if o.best_of > 1 else "") + (" --force" if force else ""))


def _value(x: float | None, metric: Metric) -> str:
    text = fmt.metric(metric.kind, x)
    return f"{text}/s" if metric.kind == "rate" and x is not None else text


def header(c: Comparison, labels: tuple[str, str]) -> str:
    """The comparison's settings, naming the multiple-comparison correction in force."""
    direction = "higher is better" if c.metric.higher_is_better else "lower is better"
    compared = sum(v.ratio is not None for v in c.verdicts)
    if c.correction == "bh":
        correction = (f"Benjamini-Hochberg: alpha is the false discovery rate over {compared} compared; "
                      f"intervals at {c.alpha_per_config:.2g} per config, one-sided")
    else:
        correction = (f"Bonferroni: alpha is the familywise error rate, "
                      f"{c.alpha_per_config:.2g} per config over {compared} compared")
    pairs = f"; paired rounds, each side's best of {c.best_of} rounds a pair" if c.best_of > 1 else (
        "; paired rounds" if c.paired else "")
    unit = f"{c.metric.unit}, " if c.metric.unit else ""
    return (f"{labels[1]} vs {labels[0]}: {c.metric.name} ({unit}{direction}); threshold "
            f"{100 * c.threshold:g}%, noise floor {100 * c.noise_floor:g}%, alpha {c.alpha:g} ({correction}){pairs}")


def table(c: Comparison, label: Callable[[str], str] = str, dropped: frozenset[str] = frozenset()) -> Table:
    """The verdicts, a config a row named by ``label(id)``, without the columns in ``dropped``
    (the note wraps; every other cell stays on one line)."""
    t = Table(title_justify="left")
    columns = [col for col in ("config", "verdict", "baseline", "current", "change [CI]", "n", "note")
               if col not in dropped]
    for col in columns:
        t.add_column(col, no_wrap=col != "note")
    for v in c.verdicts:
        style = STYLE[v.verdict]
        row = {**cells(c, v), "config": label(v.config_id),
               "verdict": f"[{style}]{v.verdict}[/{style}]" if style else v.verdict}
        t.add_row(*(row[col] for col in columns))
    return t


def cells(c: Comparison, v: ConfigVerdict) -> dict[str, str]:
    """One verdict's row as text: config, verdict, the two medians, the change and its
    interval, the repeats a side (n) and the note; the terminal table, the markdown and
    ``gpubench ab``'s ab.json (its report's table) all show these."""
    return {"config": v.config_id, "verdict": v.verdict, "baseline": _value(v.baseline_median, c.metric),
            "current": _value(v.current_median, c.metric), "change [CI]": change_text(v.ratio, v.ci_low, v.ci_high),
            "n": f"{v.n_baseline}/{v.n_current}", "note": v.note}


def show(console: Console, c: Comparison, labels: tuple[str, str], base: list[Result], cur: list[Result],
         reproduce: str) -> tuple[str, dict[str, list[str]]]:
    """Print a comparison as ``compare`` and ``ab`` do: its settings, the verdicts, what it could
    see, the triage of each regressed config, and the counts; returns the power line and the
    triage, for the markdown and JSON."""
    console.print(header(c, labels), highlight=False, soft_wrap=True)
    # at a narrow terminal: short names, then without the repeats and the two medians (the
    # change and its interval are the verdict's figures)
    fitted, lines = fmt.fitted(console, lambda label, dropped: table(c, label, dropped),
                               [v.config_id for v in c.verdicts], droppable=("n", "current", "baseline"))
    console.print(fitted)
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)
    power = power_line(c)
    if power:
        console.print(power, highlight=False, soft_wrap=True)
    triaged = {v.config_id: triage(base, cur, v.config_id, labels, reproduce) for v in c.regressed}
    for config_id, lines in triaged.items():
        console.print(f"[red]triage[/red] {config_id}:", highlight=False, soft_wrap=True)
        for line in lines:
            console.print(f"  {line}", highlight=False, soft_wrap=True)
    counts = ", ".join(f"{n} {k}" for k, n in c.counts().items())
    console.print(("[red]REGRESSION[/red]: " if c.regressed else "no regression: ") + counts, highlight=False)
    return power, triaged


def markdown(c: Comparison, labels: tuple[str, str], power: str = "",
             triaged: dict[str, list[str]] | None = None) -> str:
    """The comparison for a CI job summary or a PR comment. Labels (paths), config ids, notes
    (a failed repeat's reason) and triage lines are data: each goes through fmt.md_cell."""
    counts = ", ".join(f"{n} {k}" for k, n in c.counts().items())
    status = "**regression**" if c.regressed else "no regression"
    lines = [f"## gpubench compare: {status}", "", fmt.md_cell(header(c, labels)), "", counts, "",
             *([fmt.md_cell(power), ""] if power else []),
             "| config | verdict | baseline | current | change [CI] | repeats | note |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    order = {k: i for i, k in enumerate(("regressed", "inconclusive", "missing", "improved", "new", "unchanged"))}
    for v in sorted(c.verdicts, key=lambda v: order[v.verdict]):
        row = cells(c, v)
        row["verdict"] = f"**{v.verdict}**" if v.verdict == "regressed" else v.verdict
        lines.append(fmt.md_row(row.values()))
    for config_id, found in (triaged or {}).items():
        lines += ["", f"### Triage: {fmt.md_cell(config_id)}", "", *(f"- {fmt.md_cell(x)}" for x in found)]
    return "\n".join(lines) + "\n"


def power_line(c: Comparison) -> str:
    """What this comparison could see: the between-process noise its repeats showed (the
    median over the configs) and the smallest slowdown the gate catches 95% of the time with
    that noise and these repeats (simulated with the gate's rule: gate.power)."""
    from gpubench.gate.power import MAX_SLOWDOWN, POWER, minimal_detectable

    measured = [v for v in c.verdicts if v.noise is not None and v.ratio is not None]
    if not measured:
        return ""
    sigma = statistics.median(v.noise for v in measured if v.noise is not None)
    repeats = min(min(v.n_baseline, v.n_current) for v in measured)
    mde = minimal_detectable(sigma, repeats, c.alpha_per_config, c.threshold, c.noise_floor, paired=c.paired)
    seen = (f"a slowdown of {100 * mde:.1f}% or more is caught {POWER:.0%} of the time" if mde is not None
            else f"no slowdown up to {MAX_SLOWDOWN:.0%} is caught {POWER:.0%} of the time")
    what, unit = ((f"spread of the ratio of the bests of {c.best_of} rounds", f"pairs of bests of {c.best_of}")
                  if c.best_of > 1 else ("spread of the per-round ratio", "rounds") if c.paired else
                  ("noise between processes", "repeats a side"))
    return (f"{what} in this comparison: {100 * (math.exp(sigma) - 1):.1f}% (median over "
            f"{len(measured)} config(s)); with {repeats} {unit} at this gate's settings, {seen}")


# characters XML 1.0 cannot hold, even escaped; ElementTree writes them as they are, and the
# report would not parse (an id or a failed repeat's reason is data)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml(suite: ET.Element) -> str:
    ET.indent(suite)
    text = _NOT_XML.sub("\ufffd", ET.tostring(suite, encoding="unicode"))
    return '<?xml version="1.0" encoding="utf-8"?>\n' + text + "\n"


def junit(c: Comparison, labels: tuple[str, str], power: str = "",
          triaged: dict[str, list[str]] | None = None) -> str:
    """The verdicts as a JUnit XML report, the test report CI systems show (GitLab, Jenkins,
    GitHub actions that publish test results): one test case per config; ``regressed`` is a
    failure, ``missing`` an error (no result), ``inconclusive`` skipped (not decided), the others
    pass. The gate's settings, the correction in force among them, are the suite's properties."""
    compared = list(c.verdicts)
    suite = ET.Element("testsuite", name=f"gpubench compare: {labels[1]} vs {labels[0]}", tests=str(len(compared)),
                       failures=str(sum(v.verdict == "regressed" for v in compared)),
                       errors=str(sum(v.verdict == "missing" for v in compared)),
                       skipped=str(sum(v.verdict == "inconclusive" for v in compared)))
    props = ET.SubElement(suite, "properties")
    for name, value in (("gate", header(c, labels)), ("power", power), ("metric", c.metric.name),
                        ("threshold", f"{100 * c.threshold:g}%"), ("noise_floor", f"{100 * c.noise_floor:g}%"),
                        ("alpha", f"{c.alpha:g}"), ("correction", c.correction), ("paired", str(c.paired).lower()),
                        ("best_of", str(c.best_of))):
        if value:
            ET.SubElement(props, "property", name=name, value=value)
    for v in compared:
        case = ET.SubElement(suite, "testcase", classname=f"gpubench.{c.metric.name}", name=v.config_id)
        row = cells(c, v)
        line = (f"{v.verdict}: {row['change [CI]']}; {labels[0]} {row['baseline']}, {labels[1]} {row['current']}, "
                f"n {row['n']}" + (f"; {v.note}" if v.note else ""))
        if v.verdict == "regressed":
            ET.SubElement(case, "failure", message=line, type="regressed").text = "\n".join(
                [line, *(triaged or {}).get(v.config_id, [])])
        elif v.verdict == "missing":
            ET.SubElement(case, "error", message=line, type="missing")
        elif v.verdict == "inconclusive":
            ET.SubElement(case, "skipped", message=line)
        else:
            ET.SubElement(case, "system-out").text = line
    return _xml(suite)


def junit_error(command: str, message: str) -> str:
    """The JUnit report of a ``compare`` or ``ab`` refused as bad input (exit 2): one suite with
    one failed test case whose message is the error line, so that a CI step that always
    publishes the report shows why there are no verdicts instead of finding no file."""
    suite = ET.Element("testsuite", name=f"gpubench {command}", tests="1", failures="1", errors="0", skipped="0")
    case = ET.SubElement(suite, "testcase", classname=f"gpubench.{command}", name="input")
    ET.SubElement(case, "failure", message=message, type="bad input").text = (
        f"gpubench {command} refused its input (exit 2), so nothing was compared: {message}")
    return _xml(suite)
