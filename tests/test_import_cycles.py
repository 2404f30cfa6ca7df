"""No import circle between gpubench's modules, counting every import: at module level, inside
functions (lazy imports) and under ``TYPE_CHECKING`` (import-linter, in CI, leaves the last
out, since an annotation is no dependency at run time; a circle hidden there still ties two
modules together)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gpubench"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each gpubench module and the gpubench modules it imports anywhere in its text (a ``from
    package import name`` counts as the submodule where ``package.name`` is one)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base
                                                                                                    else []))
                found.add(base)
                found |= {f"{base}.{a.name}" for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (each found once, from its first module in sorted order)."""
    out: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start and frozenset(path) not in seen:
                    seen.add(frozenset(path))
                    out.append([*path, start])
                elif nxt not in path and nxt > start:
                    stack.append((nxt, [*path, nxt]))
    return out


def test_the_detector_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_gpubench_imports_itself_back():
    graph = import_graph()
    assert "gpubench.backends.pytorch.compile" in graph["gpubench.backends.pytorch.trainer"]  # the graph is read
    assert cycles(graph) == []
