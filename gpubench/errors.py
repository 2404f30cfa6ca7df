"""Exceptions that the CLI turns into one-line messages and exit codes."""

from __future__ import annotations

import difflib
import errno
import re
import signal
import sys
from collections.abc import Iterable


class InputError(Exception):
    """Bad input from the user (suite file, CLI flag, results file): exit code 2, no traceback.

    The message should name the file, the key and the allowed values, so that the user can
    fix it without reading the source.
    """


class StorageError(InputError):
    """The run directory cannot be written (a full disk, a quota, a read-only file system):
    not a config's failure, so nothing is recorded for the config and the sweep stops (every
    next config would fail the same way); ``--resume`` runs it once there is room. One line
    naming the path, exit 2."""


# what a write that fails for want of room or permission to write reads as (ENOSPC, EDQUOT,
# EROFS, EFBIG): the machine's problem, not the config's
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)
EXIT_STORAGE = 75  # a worker that could not hand over its outcome (EX_TEMPFAIL: try again later)
STORAGE_LINE = "gpubench worker: cannot write its outcome"  # ... and the line it says so with, in its log

# every command's exit codes, here alone (what each means for each command: commands.EXIT_CODES;
# a stop's 130 or 143: stop_exit_code)
EXIT_OK = 0
EXIT_FAILED = 1  # run, profile: a config ended error or timeout, or nothing was measured
EXIT_REGRESSED = 1  # compare, ab: a config regressed
EXIT_NOT_NAMED = 1  # bisect: no commit named
EXIT_BASELINE_FAILED = 1  # advise: the baseline itself does not train
EXIT_BAD_INPUT = 2  # one line naming what was wrong and what is allowed; nothing written
EXIT_INTERRUPTED = 128 + signal.SIGINT  # a run whose jobs were cancelled (a scheduler's), as a Ctrl-C


def os_error_line(e: OSError) -> str:
    """``/proc/x: No such file or directory``: the file and the reason, without the errno."""
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    return f"{where}: {e.strerror}" if where and e.strerror else str(e)


def did_you_mean(value: object, allowed: Iterable[str]) -> str:
    """`` (did you mean batch_size?)`` for a value close to one of ``allowed`` (a typo), else ``""``."""
    near = difflib.get_close_matches(str(value), list(dict.fromkeys(allowed)), n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""


def choices_message(kind: str, value: object, allowed: list[str] | tuple[str, ...]) -> str:
    """``unknown precision 'fp17'; expected one of: fp32, tf32, ...``, with ``did you mean``
    first where the value is a typo of one of them."""
    return f"unknown {kind} {value!r}{did_you_mean(value, allowed)}; expected one of: {', '.join(allowed)}"


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with its control characters written out (``\\x1b``): a message quotes what the
    user gave (a --set value, a file's content), and a terminal would obey an escape sequence
    in it (clear the screen, recolour, retitle) instead of showing it."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def error_line(message: object) -> str:
    """The one line a command ends on for bad input."""
    return printable(f"gpubench: error: {message}")


def warn(message: str) -> None:
    """A warning for the user: one line on stderr, so that stdout keeps only the results."""
    print(printable(f"gpubench: warning: {message}"), file=sys.stderr)


def note(message: str) -> None:
    """Something the user should know before a run starts: one line on stderr, like a warning."""
    print(printable(f"gpubench: note: {message}"), file=sys.stderr)


class Stopped(KeyboardInterrupt):
    """A termination signal (SIGTERM) raised as an exception in the main thread, so that a
    command stops the way Ctrl-C stops it: the running worker's process group is killed,
    finished results stay on disk and the message says how to resume. A KeyboardInterrupt,
    so every place that cleans up after Ctrl-C cleans up after this too."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_exit_code(e: KeyboardInterrupt) -> int:
    """128 + the signal's number, as a shell reports a process the signal killed: 130 for
    Ctrl-C (SIGINT), 143 for SIGTERM."""
    return 128 + getattr(e, "signum", signal.SIGINT)


def stop_message(e: KeyboardInterrupt, detail: str = "") -> None:
    """One line on stderr: ``gpubench: interrupted`` (Ctrl-C) or ``gpubench: stopped by
    SIGTERM``, then ``detail`` (what was kept, how to go on)."""
    what = f"stopped by {signal.Signals(e.signum).name}" if isinstance(e, Stopped) else "interrupted"
    print(f"gpubench: {what}" + (f"; {detail}" if detail else ""), file=sys.stderr)
