"""Number formatting with units, shared by the terminal, the HTML and markdown reports and the
gate: one writer per metric kind (gpubench.results.metrics)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich only where a table is fitted: the worker imports this module at its start
    from rich.console import Console
    from rich.table import Table


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def rate(v: Any) -> str:
    """Samples per second, 3-4 significant digits: 812.3, 12.3k, 1.23M."""
    if _missing(v):
        return "-"
    v = float(v)
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e4:
        return f"{v / 1e3:.1f}k"
    if v >= 1e3:
        return f"{v / 1e3:.2f}k"
    return f"{v:.1f}"


def rate_ci(v: Any, lo: Any, hi: Any) -> str:
    if _missing(v):
        return "-"
    return f"{rate(v)}/s [{rate(lo)}, {rate(hi)}]"


def nbytes(v: Any) -> str:
    if _missing(v):
        return "-"
    v = float(v)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024:
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TiB"


def ms(v: Any) -> str:
    """Milliseconds, 3 significant digits; a second or more in seconds (not 1.2e+03 ms)."""
    if _missing(v):
        return "-"
    v = float(v)
    return f"{v / 1000:.3g} s" if abs(v) >= 1000 else f"{v:.3g} ms"


def pct(v: Any) -> str:
    return "-" if _missing(v) else f"{100 * float(v):.1f}%"


def ratio(v: Any) -> str:
    return "-" if _missing(v) else f"{float(v):.2f}x"


def tflops(v: Any) -> str:
    """FLOP/s in TFLOP/s, 3 significant digits (CPU figures are small fractions)."""
    return "-" if _missing(v) else f"{float(v):.3g} TFLOP/s"


def joules(v: Any) -> str:
    if _missing(v):
        return "-"
    v = float(v)
    return f"{v * 1e3:.3g} mJ" if v < 1 else f"{v:.3g} J"


def seconds(v: Any) -> str:
    return "-" if _missing(v) else f"{float(v):.3g} s"


def count(v: Any) -> str:
    return "-" if _missing(v) else f"{int(v):,}"


def number(v: Any) -> str:
    return "-" if _missing(v) else f"{float(v):.4g}"


def flag(v: Any) -> str:
    return "-" if _missing(v) else ("yes" if v else "no")


def text(v: Any) -> str:
    return "-" if _missing(v) else str(v)


# a metric's ``kind`` (gpubench.results.metrics) -> how its values are written
BY_KIND = {"rate": rate, "ms": ms, "s": seconds, "bytes": nbytes, "pct": pct, "ratio": ratio, "tflops": tflops,
           "joules": joules, "count": count, "number": number, "flag": flag, "text": text}


def metric(kind: str, v: Any) -> str:
    """A value of a metric of this kind, with its unit."""
    return BY_KIND[kind](v)


_MD_ESCAPES = {"\\": "\\\\", "|": "\\|", "`": "\\`", "&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "\\["}
_MD_SPECIAL = re.compile(r"[\\|`&<>\[]|\](?=[(\[:])|[\x00-\x1f\x7f\x85\u2028\u2029]")


def md_cell(v: Any) -> str:
    """Any text made safe for one cell of a GitHub-flavoured markdown table, or for a line of
    markdown: config ids, paths and error messages come from users and exceptions, and in a CI
    job summary a ``|`` would split the row, a newline end it, ``<img onerror=...>`` render as
    HTML and ``[x](url)`` as a link. HTML's ``& < >`` become entities, ``\\ | ` `` are
    backslash-escaped (no code span can form, so the entities show as the characters), every
    ``[`` and a ``]`` that would close a link, image or link definition is escaped, and line
    breaks and other control characters become spaces. Everything else is kept, so ids stay readable in the raw file."""
    return _MD_SPECIAL.sub(lambda m: _MD_ESCAPES.get(m.group(), "\\]" if m.group() == "]" else " "), str(v))


def md_row(cells: Iterable[Any]) -> str:
    """One row of a markdown table, every cell through md_cell."""
    return "| " + " | ".join(md_cell(c) for c in cells) + " |"


def short_names(ids: list[str], limit: int = 24) -> dict[str, str]:
    """Each config id's name for a narrow terminal: the id without the dash-separated parts that
    every id has (the device, the batch... where the sweep does not vary them), cut to ``limit``
    characters; numbered where two would read the same. One id keeps its first part."""
    parts = [i.split("-") for i in ids]
    common = set(parts[0][1:]) if len(ids) == 1 else set(parts[0]).intersection(*parts[1:])
    names = {}
    for i, p in zip(ids, parts, strict=True):
        kept = "-".join(x for x in p if x not in common) or p[0]
        names[i] = kept if len(kept) <= limit else kept[:limit - 1] + "…"
    if len(set(names.values())) < len(names):
        names = {i: f"#{k} {n}" for k, (i, n) in enumerate(names.items(), 1)}
    return names


def table_fits(console: Console, table: Table) -> bool:
    """Whether ``table`` fits the console's width with every no-wrap cell whole and each wrapping
    column given 20 columns at most."""
    from rich.measure import Measurement

    kept = [column.max_width for column in table.columns]
    for column in table.columns:
        if not column.no_wrap:
            column.max_width = min(column.max_width or 20, 20)
    width = Measurement.get(console, console.options.update_width(10**5), table).maximum
    for column, max_width in zip(table.columns, kept, strict=True):
        column.max_width = max_width
    return width <= console.width


def fitted(console: Console, make: Callable[[Callable[[str], str], frozenset[str]], Table], ids: list[str],
           droppable: tuple[str, ...] = ()) -> tuple[Table, list[str]]:
    """A terminal table whose every column fits the console (a narrow terminal once made each
    column of an 80-column table an ellipsis): ``make(name, dropped)`` builds it, each config
    named by ``name(id)``, without the columns in ``dropped``. First with the full ids; where
    that is too wide, with short names (``short_names``), then without the ``droppable``
    columns, in order, until it fits; where none fits, the whole table (gpubench.cli.Terminal
    prints a table too wide for it as records). Returns the table and the lines to print below
    it: each short name's full id, and the columns left out."""
    def fits(table: Table) -> bool:
        return table_fits(console, table)

    table = make(str, frozenset())
    if fits(table) or not ids:
        return table, []
    names = short_names(ids)
    dropped: list[str] = []
    table = make(names.__getitem__, frozenset())
    for column in droppable:
        if fits(table):
            break
        dropped.append(column)
        table = make(names.__getitem__, frozenset(dropped))
    if not fits(table):  # no table fits: the whole one, which the command line's console prints as records
        return make(str, frozenset()), []
    lines = [f"  {names[i]} = {i}" for i in ids if names[i] != i]
    lines = (["config ids:", *lines] if lines else []) + (
        [f"left out at this terminal's width ({console.width} columns): {', '.join(dropped)} (every figure is in "
         "the results and the report)"] if dropped else [])
    return table, lines
