"""Whole files or nothing: atomic writes (a temporary file beside the target, fsynced, then
renamed over it). A leaf module, so that every layer (the backends' profiler traces, the
report's charts, the run directory) writes the same way."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path


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
