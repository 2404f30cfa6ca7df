"""Output paths named on the command line: checked before the work, written atomically.

A command that measures for minutes must not fail at its end because ``--json`` names a path
inside a file, so commands check their output paths first. A write that fails anyway (a full
disk, a path that changed meanwhile) is an InputError naming the flag and the path: one line
and exit 2 from the CLI, never a traceback or a half-written file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gpubench.errors import InputError
from gpubench.files import write_text_atomic


def check_output_file(path: Path | None, flag: str) -> None:
    """``path`` can be written as a file: not a directory, and its folder exists or can be made."""
    if path is None:
        return
    if path.is_dir():
        raise InputError(f"{flag} {path}: is a directory; expected a file path")
    _check_can_create_in(path.parent, flag, path)


def check_output_dir(path: Path | None, flag: str) -> None:
    """``path`` is a directory, or one that can be made, where files can be created."""
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise InputError(f"{flag} {path}: exists and is not a directory")
    _check_can_create_in(path, flag, path)


def _check_can_create_in(folder: Path, flag: str, given: Path) -> None:
    """The nearest existing ancestor of ``folder`` is a directory where a file can be created
    (tried with a temporary file: permission bits say nothing for root or a read-only mount)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{flag} {given}: {existing} is not a directory")
    try:
        fd, name = tempfile.mkstemp(prefix=".gpubench-check-", dir=existing)
    except OSError as e:
        raise InputError(f"{flag} {given}: cannot create files in {existing} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(name)


def write_output(path: Path, text: str, flag: str) -> None:
    """Write an output file atomically, making its folder if needed; an OSError becomes an
    InputError naming the flag."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot write: {e.strerror or e}") from None
