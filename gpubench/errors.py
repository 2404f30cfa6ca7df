"""Exceptions that the CLI turns into one-line messages and exit codes."""

from __future__ import annotations

import sys


class InputError(Exception):
    """Bad input from the user (suite file, CLI flag, results file): exit code 2, no traceback.

    The message should name the file, the key and the allowed values, so that the user can
    fix it without reading the source.
    """


def choices_message(kind: str, value: object, allowed: list[str] | tuple[str, ...]) -> str:
    """``unknown precision 'fp17'; expected one of: fp32, tf32, ...``"""
    return f"unknown {kind} {value!r}; expected one of: {', '.join(allowed)}"


def warn(message: str) -> None:
    """A warning for the user: one line on stderr, so that stdout keeps only the results."""
    print(f"gpubench: warning: {message}", file=sys.stderr)


def note(message: str) -> None:
    """Something the user should know before a run starts: one line on stderr, like a warning."""
    print(f"gpubench: note: {message}", file=sys.stderr)
