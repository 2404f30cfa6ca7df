"""The run directory: run.json (what was asked) and results.jsonl (one line per finished
config repeat, appended as each finishes, so a crash or Ctrl-C loses nothing finished)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpubench.errors import InputError
from gpubench.errors import warn as warn_user
from gpubench.files import file_stem, write_text_atomic
from gpubench.results import metrics as _typed  # noqa: F401  (declares its figures' types: every line read is checked by them)
from gpubench.results.result import Result, ResultError
from gpubench.results.schema import SUPPORTED_SCHEMA_VERSIONS, clean

RESULTS_FILE = "results.jsonl"
RUN_FILE = "run.json"
NODE_FILE = "node.jsonl"  # node r > 0 of a multi-node run: its own outcome of each config
AB_FILE = "ab.json"  # gpubench ab: the verdicts, beside its two sides' run directories

_fast_loads: Callable[[bytes], Any] | None
try:  # a faster decoder of the same JSON, where installed (the history extra brings it)
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - depends on the environment
    _fast_loads = None


MAX_DEPTH = 32  # a result line nests 4-5 levels; deeper is a damaged or hostile file


def decode_line(line: bytes) -> Any:
    """One line of JSON. orjson where installed (faster on result lines: an ingest decodes
    every line it records), else, and for what orjson refuses (NaN, integers
    beyond 64 bits), the standard library, so both read the same lines the same way and a bad
    line is the standard library's ValueError. A value nested deeper than MAX_DEPTH is a
    ValueError too (every later reader walks it recursively)."""
    obj: Any = None
    if _fast_loads is not None:
        try:
            obj = _fast_loads(line)
        except ValueError:
            obj = None
    if obj is None:
        try:
            obj = json.loads(line)
        except RecursionError:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    check_depth(obj)
    return obj


def check_depth(obj: Any, limit: int = MAX_DEPTH) -> None:
    """ValueError when ``obj`` nests lists and objects deeper than ``limit`` (walked without
    recursion, so a hostile file cannot exhaust the stack here either)."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            raise ValueError(f"nested deeper than {limit} levels")
        stack.extend((child, depth + 1) for child in children)


def json_text(obj: Any) -> str:
    """gpubench's JSON files: indented, non-finite floats as null."""
    return json.dumps(clean(obj), indent=2, sort_keys=False) + "\n"


def write_json_atomic(path: Path, obj: Any) -> None:
    write_text_atomic(path, json_text(obj))


def _write_all(fd: int, data: bytes) -> None:
    """os.write may write less than asked (a full disk): go on until all is written."""
    while data:
        n = os.write(fd, data)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        data = data[n:]


def open_own(path: Path, flags: int, mode: int = 0o644, run_dir: Path | None = None) -> int:
    """``os.open`` of a file of a run directory, never through a symbolic link and only as a
    regular file: anyone who can write into a shared run directory could otherwise point
    ``.lock`` or ``results.jsonl`` at a file of whoever resumes it (which the lock's write or an
    append would overwrite), or at a FIFO or ``/dev/zero`` that a reader waits on or reads
    without end. With ``run_dir``, the folders between it and the file (``logs/``) are not
    links either (the run directory itself may be: its path is the user's). Either is one line
    (InputError); other OSErrors are the caller's."""
    folder = path.parent
    while run_dir is not None and folder != run_dir and run_dir in folder.parents:
        if folder.is_symlink():
            raise InputError(f"{folder}: a symbolic link; gpubench reads and writes a run directory's files only "
                             "where they are, never through a link (replace it with the folder)")
        folder = folder.parent
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(f"{path}: a symbolic link; gpubench reads and writes a run directory's files only where "
                             "they are, never through a link (remove it)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{path}: not a regular file (a FIFO, a device or a directory); gpubench reads and writes "
                         "only regular files in a run directory")
    return fd


def read_own(path: Path) -> bytes:
    """The whole of a run directory's file (``open_own``)."""
    fd = open_own(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def result_line(result: Result) -> str:
    """A result as its line of results.jsonl (without the newline)."""
    return json.dumps(clean(result.to_json()), separators=(",", ":"))


def append_result(run_dir: Path, result: Result, name: str = RESULTS_FILE) -> None:
    """Append one result as one whole line, then fsync. The file only ever gains whole lines:
    a write that fails part-way (disk full) is undone and is an error naming the file, and a
    file that already ends in half a line (a killed run not yet resumed) is not appended to."""
    path = run_dir / name
    line = (result_line(result) + "\n").encode()
    fd = open_own(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        start = os.fstat(fd).st_size
        if start and os.pread(fd, 1, start - 1) != b"\n":
            raise InputError(f"{path}: ends with a half-written line (a killed run); gpubench run --resume cuts it "
                             "off before adding results")
        written = False
        try:
            _write_all(fd, line)
            written = True
            os.fsync(fd)
        except BaseException as e:
            if written and not isinstance(e, OSError):  # Ctrl-C while syncing a whole line: it stays
                raise
            try:
                os.ftruncate(fd, start)  # never half a line that later appends would follow
                left = "the part written was removed"
            except OSError:
                left = "half a line is left at its end (gpubench run --resume cuts it off)"
            if isinstance(e, OSError):
                raise InputError(f"{path}: could not append a result: {e.strerror or e}; the result is not recorded "
                                 f"and {left}") from None
            raise
    finally:
        os.close(fd)


def create_run_dir(out: Path, base_id: str) -> Path:
    """Make a new, empty run directory ``out/<run_id>`` (suffix -2, -3... if taken)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            run_id = base_id if n == 1 else f"{base_id}-{n}"
            try:
                (out / run_id).mkdir()
                return out / run_id
            except FileExistsError:
                continue
    except OSError as e:
        raise InputError(f"{out}: cannot create a run directory there: {e.strerror or e}") from None
    raise InputError(f"{out}: cannot find a free run directory name for {base_id}")


def load_run(run_dir: Path) -> dict[str, Any]:
    """A run's run.json: an object (readers take its keys with ``.get``), whose ``env`` is an
    object or null."""
    path = run_dir / RUN_FILE
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run directory")
    try:
        meta = decode_line(read_own(path))
    except FileNotFoundError:
        raise InputError(f"{path}: missing; is {run_dir} a gpubench run directory?") from None
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: unreadable run file: {e}") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: not a run file: expected a JSON object (run_id, suite, args, env, ...), "
                         f"got a {type(meta).__name__}")
    if not isinstance(meta.get("env"), (dict, type(None))):
        raise InputError(f"{path}: 'env' is a {type(meta['env']).__name__}, not an object (the environment "
                         "fingerprint)")
    return meta


def run_env(meta: dict[str, Any], results: list[Result]) -> dict[str, Any]:
    """A run's environment fingerprint: from run.json, else from its first result that has one
    (a result recorded without a worker, under Slurm, has none)."""
    env: dict[str, Any] = meta.get("env") or next((r.env for r in results if r.env), {})
    return env


def load_results(run_dir: Path, repair: bool = False, strict: bool = True,
                 warn: Callable[[str], None] = warn_user) -> list[Result]:
    """All results of a run (read_results without the lines)."""
    return [r for _, r in read_results(run_dir, repair, strict, warn)]


def read_results(run_dir: Path, repair: bool = False, strict: bool = True,
                 warn: Callable[[str], None] = warn_user) -> list[tuple[str, Result]]:
    """All results of a run, each with its line as written. A half-written last line (a killed run) is skipped with a
    warning, and with ``repair`` cut off the file so that appends continue cleanly. A bad line
    elsewhere (unparsable, or without the shape readers rely on: ``schema.result_problem``), or
    an unknown schema version, is an InputError naming the line; with
    ``strict=False`` (reports) it is skipped with a warning instead. A file that cannot be read
    at all is an InputError either way. Warnings go to ``warn`` (the user's stderr unless the
    caller collects them, as the report does)."""
    path = run_dir / RESULTS_FILE
    if not os.path.lexists(path):  # a link, even a dangling one, is said so (open_own)
        return []
    try:
        raw = read_own(path)
    except OSError as e:  # no permission: not a line to skip
        raise InputError(f"{path}: unreadable results file: {e.strerror or e}") from None
    lines = raw.split(b"\n")
    results: list[tuple[str, Result]] = []
    first_line: dict[tuple[str, int], int] = {}  # (config id, repeat) -> the line that has it
    offset = 0
    for i, line in enumerate(lines, start=1):
        start = offset
        offset += len(line) + 1
        if not line.strip():
            continue
        try:
            obj = decode_line(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            is_last = all(not rest.strip() for rest in lines[i:])
            if is_last and not raw.endswith(b"\n"):
                warn(f"{path}:{i}: skipping a truncated last line (a run killed while writing)")
                if repair:
                    fd = open_own(path, os.O_RDWR)
                    try:
                        os.ftruncate(fd, start)
                    finally:
                        os.close(fd)
                break
            _problem(f"{path}:{i}: corrupt result line: {e}", strict, warn)
            continue
        version = obj.get("schema_version")
        if version not in SUPPORTED_SCHEMA_VERSIONS:
            _problem(f"{path}:{i}: unknown schema_version {version!r}; this gpubench reads: "
                     f"{', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))}", strict, warn)
            continue
        try:
            result = Result.from_json(obj)
        except ResultError as e:
            _problem(f"{path}:{i}: {e}", strict, warn)
            continue
        key = (result.config_id, result.repeat)
        if key in first_line:  # counted twice it would be an extra repeat of every figure
            _problem(f"{path}:{i}: config {result.config_id} repeat {result.repeat} is already on line "
                     f"{first_line[key]}: a results file holds each config repeat once (two runs wrote into one "
                     "directory?)", strict, warn)
            continue
        first_line[key] = i
        results.append((line.decode(), result))
    return results


def _problem(message: str, strict: bool, warn: Callable[[str], None]) -> None:
    if strict:
        raise InputError(message)
    warn(message + " (line skipped)")


def slug(text: str) -> str:
    """A file-name-safe version of a config id (files.file_stem)."""
    return file_stem(text)


LOCK_FILE = ".lock"


@contextmanager
def locked_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold the run directory's lock while a run or a resume writes it: a second writer gets
    one line naming the holder (two resumes of one directory would otherwise both run every
    missing config, and write each result twice). An advisory ``flock`` on RUN_DIR/.lock, which
    the kernel releases when the holder dies, however it dies."""
    path = run_dir / LOCK_FILE
    try:
        fd = open_own(path, os.O_RDWR | os.O_CREAT)
    except OSError as e:
        raise InputError(f"{path}: cannot open the run directory's lock: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"{run_dir}: another gpubench is writing this run directory ({_holder(fd)}); wait for it "
                             "to end, or stop it, then resume") from None
        except OSError as e:  # a file system without flock (Lustre mounted noflock, some NFS): go on, unguarded
            if e.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            warn_user(f"{path}: this file system cannot lock files ({e.strerror or e}); nothing stops a second "
                      "gpubench from writing this run directory at the same time")
            yield
            return
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        with contextlib.suppress(OSError):  # who holds it is for the message only
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode(), 0)
        yield
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        h = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {int(h['pid'])} on {h['host']}, since {h['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its pid unknown"


SUPERSEDED_FILE = "superseded.jsonl"
RETRIED_STATUSES = ("error", "timeout")  # what ``run --resume --retry-failed`` runs again (and supersedes)


def superseded_lines(run_dir: Path) -> tuple[str, ...]:
    """The result lines a run moved out (``supersede``), as written; none where it moved none.
    An unreadable file is an InputError naming it."""
    try:
        text = read_own(run_dir / SUPERSEDED_FILE).decode("utf-8")
    except FileNotFoundError:
        return ()
    except (OSError, ValueError) as e:
        raise InputError(f"{run_dir / SUPERSEDED_FILE}: unreadable: {e}") from None
    return tuple(line for line in text.splitlines() if line)


def supersede(run_dir: Path, drop: Callable[[Result], bool]) -> int:
    """Move the results ``drop`` picks out of results.jsonl, into superseded.jsonl (kept, never
    read as results), so that a resume runs those config repeats again without a result being
    counted twice; results.jsonl is rewritten whole (atomically). Returns how many moved."""
    found = read_results(run_dir)
    moved = [line for line, r in found if drop(r)]
    if not moved:
        return 0
    with os.fdopen(open_own(run_dir / SUPERSEDED_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a",
                   encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in moved))
        f.flush()
        os.fsync(f.fileno())
    write_text_atomic(run_dir / RESULTS_FILE, "".join(line + "\n" for line, r in found if not drop(r)))
    return len(moved)
