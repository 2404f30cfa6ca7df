"""Whole files or nothing: atomic writes (a temporary file beside the target, fsynced, then
renamed over it), and the one guarded reader of a file the user names (a suite, a price table,
an A/B's JSON). Below every layer but errors, so that every layer (the backends' profiler
traces, the report's charts, the run directory) writes and reads the same way."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

from gpubench.errors import InputError


def _temporary_beside(path: Path) -> Path:
    """A hidden name in the target's directory (``os.replace`` needs the same file system)
    that keeps the target's suffix, since some writers pick the format from it (matplotlib's
    ``savefig``, torch's ``export_chrome_trace`` for ``.gz``)."""
    return path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")


def write_atomic(path: Path, writer: Callable[[Path], None]) -> None:
    """``writer(tmp)`` writes the whole file at a temporary path beside ``path``; the file is
    then fsynced and renamed over the target, so that a reader, or a process killed midway,
    never sees half a file. For writers that only take a path (a chart's ``savefig``, a
    profiler's trace export). If the writer or the rename fails, the temporary file is removed
    and the target is as it was."""
    tmp = _temporary_beside(path)
    try:
        writer(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` as the whole of ``path``, atomically (``write_atomic``)."""
    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    write_atomic(path, write)


FILE_STEM_CHARS = 160  # room for "-r<repeat>.log" and the like within a file system's 255 bytes


def file_stem(name: str) -> str:
    """A file-name-safe stem for a config id: characters other than letters, digits and
    ``._=-`` become ``_``; a stem longer than FILE_STEM_CHARS is cut and ends in a short hash of
    the whole name. (A sweep's expansion checks that no two of its configs share a stem.)"""
    safe = re.sub(r"[^A-Za-z0-9._=-]+", "_", name)
    if len(safe) <= FILE_STEM_CHARS:
        return safe
    digest = hashlib.sha1(name.encode()).hexdigest()[:10]
    return f"{safe[:FILE_STEM_CHARS - 11]}-{digest}"


USER_FILE_BYTES = 16 << 20  # a suite, a price table, an A/B's JSON: text a person writes or a command wrote


def read_user_file(path: Path, what: str, limit: int = USER_FILE_BYTES) -> bytes:
    """The whole of a file the user names (``what``: ``--price FILE``, ``suite``), or one line
    (InputError) naming it and why it cannot be read: missing or unreadable, a directory, a FIFO
    or a device (which would hang a read or never end it: opened without blocking, then refused
    unless it is a regular file, through a link too), or larger than ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise InputError(f"{what} {path}: cannot be read ({e.strerror or e})") from None
    except ValueError as e:  # a NUL in the name
        raise InputError(f"{what} {path!r}: not a path ({e})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a FIFO, a device or a socket)"
            raise InputError(f"{what} {path}: {kind}; expected a file")
        if info.st_size > limit:
            raise InputError(f"{what} {path}: {info.st_size} bytes, over the {limit:,} bytes a file of this kind may "
                             "have")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise InputError(f"{what} {path}: cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while read (/proc files report 0)
        raise InputError(f"{what} {path}: over the {limit:,} bytes a file of this kind may have")
    return data


def read_user_text(path: Path, what: str, limit: int = USER_FILE_BYTES) -> str:
    """``read_user_file`` decoded as UTF-8; other bytes are one line naming where they are."""
    data = read_user_file(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise InputError(f"{what} {path}: line {line}: not UTF-8 text (byte 0x{data[e.start]:02x}); save the file "
                         "as UTF-8") from None
