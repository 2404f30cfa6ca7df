"""Bad command lines, plugins and devices: one line on stderr, exit 2; warnings on stderr."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli


@pytest.mark.parametrize("args, message", [
    (["run", "--repeats", "0"], "gpubench run: error: argument --repeats: expected a positive integer, got 0"),
    (["profile", "s.toml", "--steps", "0"], "gpubench profile: error: argument --steps: expected a positive integer"),
    (["find-batch", "s.toml", "--limit", "0"], "gpubench find-batch: error: argument --limit: expected a positive"),
    (["compare", "a", "b", "--alpha", "x"], "gpubench compare: error: argument --alpha: invalid float value: 'x'"),
    (["run", "--telemetry-interval-ms", "abc"], "gpubench run: error: argument --telemetry-interval-ms: invalid int"),
    (["export", "r", "--format", "csv"], "gpubench export: error: argument --format: invalid choice: 'csv'"),
    (["baseline", "save"], "gpubench baseline save: error: the following arguments are required: run_dir, name"),
    ([], "gpubench: error: the following arguments are required: command"),
])
def test_usage_errors_are_one_line_naming_the_help(tmp_path, args, message):
    proc = run_cli(args, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    prog = message.split(": error")[0]
    assert line.startswith(message) and line.endswith(f"(see {prog} --help)")


def test_help_still_shows_the_usage(tmp_path):
    proc = run_cli(["compare", "--help"], cwd=tmp_path)
    assert proc.returncode == 0 and "usage: gpubench compare" in proc.stdout and "from 0% to below 100%" in proc.stdout
