"""Frameworks are named only in their own packages: outside ``gpubench/backends/``, no code
compares with, branches on or maps a framework's registry name (help texts and docstrings may
describe what each framework does)."""

from __future__ import annotations

import ast
from pathlib import Path

from gpubench.backends import BACKENDS, REFERENCE_FRAMEWORK
from gpubench.config import DEFAULTS

PACKAGE = Path(__file__).resolve().parent.parent / "gpubench"
# the one literal outside backends/: a Config's default framework (config.py sits below the
# backends' layer, so it cannot read backends.REFERENCE_FRAMEWORK); it must be that framework
ALLOWED = {("config.py", "framework")}


def literals_in(text: str, rel: str) -> list[str]:
    """The string constants in ``text`` (the module ``rel``) that equal a registered
    framework's name, as ``rel:line: 'name'``, other than the allowed default."""
    tree = ast.parse(text)
    allowed = {id(inner) for node in ast.walk(tree)
               if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
               and (rel, node.target.id) in ALLOWED and node.value is not None
               for inner in ast.walk(node.value)}  # its default, also inside setting("torch", ...)
    return [f"{rel}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in BACKENDS and id(node) not in allowed]


def framework_literals() -> list[str]:
    """Every such constant in gpubench outside backends/."""
    return [hit for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).parts[0] != "backends"
            for hit in literals_in(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))]


def test_the_detector_finds_a_framework_named_in_code():
    assert literals_in('if config.framework == "tensorflow":\n    pass\n', "x.py") == ["x.py:1: 'tensorflow'"]
    assert literals_in('framework: str = "torch"\n', "config.py") == []
    assert literals_in('framework: str = setting("torch", help="")\n', "config.py") == []
    assert literals_in('framework: str = "torch"\n', "suite.py") == ["suite.py:1: 'torch'"]
    assert literals_in('"""torch, tensorflow and jax"""\n', "x.py") == []  # prose is not a name


def test_no_framework_is_named_outside_its_package():
    assert framework_literals() == []


def test_a_configs_default_framework_is_the_reference_one():
    assert DEFAULTS["framework"] == REFERENCE_FRAMEWORK


def test_every_suite_key_is_one_declaration():
    """A setting is a field of Config declared with gpubench.config.setting: the suite's checks
    and help, the id and hash rules, the frame's and CSV's columns and the settings a backend
    declares support for are all read from those declarations."""
    from gpubench.config import BACKEND_CHECKED, COLUMNS, SETTING_FIELDS, SUITE_KEYS
    from gpubench.docgen import suite_keys_reference
    from gpubench.report.build import IDENTITY_CSV_COLUMNS
    from gpubench.results.frame import CONFIG_COLUMNS
    from gpubench.suite import SETTINGS

    assert list(SETTINGS) == list(SUITE_KEYS) and "nnodes" not in SETTINGS  # a run's, not a suite's
    assert all(f.metadata["help"] for f in SETTING_FIELDS)
    assert CONFIG_COLUMNS == list(COLUMNS) and set(COLUMNS) <= set(IDENTITY_CSV_COLUMNS)
    assert {"beta2", "weight_decay", "momentum"} <= set(COLUMNS)  # the last settings added, by declaration alone
    assert BACKEND_CHECKED == ("precision", "parallelism", "optimizer", "loss", "compile", "memory_format", "data",
                               "dataset", "checkpointing")
    page = suite_keys_reference()
    assert all(f"| `{key}` |" in page for key in SUITE_KEYS)
