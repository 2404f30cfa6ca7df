"""Opening a history database: where it is, connecting, and bringing its schema to this
gpubench's version (Alembic migrations, run in-process).

Every problem opening it (the extra not installed, a bad URL, a server that does not answer,
a file that is not a database, a lock held past the timeout, a schema written by a newer
gpubench) is a HistoryError: one line naming the database, exit 2, raised before any
training starts.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpubench.errors import InputError

if TYPE_CHECKING:
    import sqlalchemy as sa

DEFAULT_PATH = Path(".gpubench") / "history.db"
ENV_VAR = "GPUBENCH_DB"
LOCK_TIMEOUT_S = 30.0  # how long a writer waits for another's lock before giving up
CONNECT_TIMEOUT_S = 10  # PostgreSQL: how long to wait for the server to answer
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# the packages of the history and postgresql extras, named so that the hint works wherever
# gpubench was installed from
INSTALL_HINT = "pip install 'sqlalchemy>=2.0' 'alembic>=1.12' 'orjson>=3.9'"
POSTGRESQL_HINT = "pip install 'psycopg[binary]>=3.1'"
UNKNOWN = "not a database this version knows; give a file path, sqlite:///PATH or postgresql://USER@HOST[:PORT]/NAME"


class HistoryError(InputError):
    """The history database cannot be used: one line, exit 2."""


def resolve_url(db: str | None, environ: dict[str, str] | None = None) -> str:
    """``--db`` (a path, ``sqlite:///PATH`` or ``postgresql://...``), else ``GPUBENCH_DB``, else
    .gpubench/history.db in the working directory, as a SQLAlchemy URL (PostgreSQL through
    psycopg 3)."""
    environ = dict(os.environ) if environ is None else environ
    text = db or environ.get(ENV_VAR) or str(DEFAULT_PATH)
    if text.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + text.split("://", 1)[1]
    if text.startswith(("postgresql+", "sqlite:")):
        return text
    if "://" in text:
        raise HistoryError(f"--db {text}: {UNKNOWN}")
    return f"sqlite:///{Path(text).expanduser()}"


def display_url(url: str) -> str:
    """The URL without its password, for messages: everything between ``USER:`` and the last
    ``@`` is hidden (a password may hold ``@``, ``:``, ``/`` or ``?``, which a URL parser would
    split elsewhere), and so is a ``password=`` parameter; a text without ``://`` shows its
    scheme only."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        head, colon, _ = url.partition(":")
        return f"{head}:***" if colon and head.startswith(("postgres", "sqlite")) else url
    cred, at, tail = rest.rpartition("@")
    if at:
        user, colon, _ = cred.partition(":")
        rest = f"{user}{':***' if colon else ''}@{tail}"
    rest = re.sub(r"(?i)(password=)[^&]*", r"\1***", rest)
    return f"{scheme}://{rest}".replace("postgresql+psycopg://", "postgresql://")


def _check_server_url(url: str) -> None:
    """A PostgreSQL URL SQLAlchemy can read, with a port from 1 to 65535: else a HistoryError
    naming it (a port that is not a number would otherwise be a traceback from deep inside
    SQLAlchemy, when it first connects)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    usage = "give postgresql://USER[:PASSWORD]@HOST[:PORT]/NAME"
    try:
        port = make_url(url).port
    except (ValueError, ArgumentError) as e:
        host = url.rpartition("@")[2] if "@" in url else url.partition("://")[2]  # after any password
        found = re.search(r"^(?:\[[^\]]*\]|[^/:?]*):([^/?]*)", host)
        what = f"port {found.group(1)!r} is not a number" if found else f"not a URL SQLAlchemy can read ({e})"
        raise HistoryError(f"--db {display_url(url)}: {what}; {usage}") from None
    if port is not None and not 0 < port < 65536:
        raise HistoryError(f"--db {display_url(url)}: port {port} is not between 1 and 65535; {usage}")


def _first_line(e: BaseException) -> str:
    text = str(getattr(e, "orig", None) or e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _alembic_config(connection: sa.Connection | None = None) -> Any:
    """Alembic's configuration for the packaged migrations (there is no alembic.ini), run on
    ``connection``."""
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The schema revision this gpubench writes."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None  # the package ships its migrations
    return head


def require_history() -> None:
    """The history's libraries are installed (the ``history`` extra), else a HistoryError."""
    try:
        import alembic  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError as e:
        raise HistoryError(f"the results history needs SQLAlchemy and Alembic ({e}): {INSTALL_HINT}") from None


def make_engine(url: str) -> sa.Engine:
    """An engine for ``url``. SQLite: the file's directory made, a busy timeout of
    LOCK_TIMEOUT_S, WAL journal (readers do not block the writer) with synchronous NORMAL, and
    every transaction begun IMMEDIATE, so that two writers queue for the lock instead of
    failing midway."""
    require_history()
    import sqlalchemy as sa

    if url.startswith("sqlite:"):
        path = url.split(":///", 1)[1] if ":///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, connect_args={"timeout": LOCK_TIMEOUT_S})

        @sa.event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # transactions begun below, not by the driver
            # WAL: readers and the writer do not block each other; synchronous NORMAL: in WAL mode a
            # commit survives a crash of the process (not of the machine's power) without an fsync
            # per commit, which is what bulk ingest and a run's many small commits need
            _while_busy(dbapi_connection, ("PRAGMA foreign_keys=ON", "PRAGMA journal_mode=WAL",
                                           "PRAGMA synchronous=NORMAL"))

        @sa.event.listens_for(engine, "begin")
        def _begin(conn: sa.Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        return engine
    if url.startswith("postgresql"):
        _check_server_url(url)
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise HistoryError(f"--db {display_url(url)}: PostgreSQL needs the psycopg driver: "
                               f"{POSTGRESQL_HINT}") from None
        # use_insertmanyvalues off: many rows go through psycopg's executemany (one prepared
        # statement), not a statement of many VALUES that the driver parses again each time
        return sa.create_engine(url, use_insertmanyvalues=False,
                                connect_args={"connect_timeout": CONNECT_TIMEOUT_S,
                                              "options": f"-c lock_timeout={int(LOCK_TIMEOUT_S * 1000)}"})
    raise HistoryError(f"--db {url}: {UNKNOWN}")


def _while_busy(dbapi_connection: Any, statements: tuple[str, ...]) -> None:
    """Run ``statements`` on a new SQLite connection, retrying for up to LOCK_TIMEOUT_S while
    the database answers "locked". Opening a WAL database can fail at once, without SQLite's
    busy handler, while the last connection of another process is closing it (it holds an
    exclusive lock while it cleans up the WAL) or recovering it; the busy timeout covers only
    the locks taken later."""
    import sqlite3

    deadline = time.monotonic() + LOCK_TIMEOUT_S
    while True:
        try:
            for statement in statements:
                dbapi_connection.execute(statement)
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@contextmanager
def translated_errors(url: str) -> Iterator[None]:
    """Database errors as one HistoryError line naming the database."""
    import sqlalchemy as sa

    try:
        yield
    except sa.exc.DBAPIError as e:  # the driver's: unreachable, locked, unopenable, a lost connection...
        raise HistoryError(f"history database {display_url(url)}: {_first_line(e)}") from None


def migrate(engine: sa.Engine, url: str) -> str:
    """Bring the schema to this gpubench's head revision (creating it in an empty database);
    refuse a database whose revision this gpubench does not know (a newer one wrote it).
    Returns the revision. PostgreSQL: under an advisory lock, so that two jobs opening a new
    database at once do not both create it."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    head = head_revision()
    with translated_errors(url), engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(725163001)")
        current = MigrationContext.configure(conn).get_current_revision()
        cfg = _alembic_config(conn)
        if current is not None:
            try:
                ScriptDirectory.from_config(cfg).get_revision(current)
            except CommandError:
                raise HistoryError(f"history database {display_url(url)}: schema revision {current} was written by "
                                   f"a newer gpubench (this one knows up to {head}); upgrade gpubench to use it"
                                   ) from None
        if current != head:
            command.upgrade(cfg, "head")
        return head


def open_engine(db: str | None) -> tuple[sa.Engine, str]:
    """(engine, url) of a database ready to read and write: connected, migrated."""
    url = resolve_url(db)
    engine = make_engine(url)
    migrate(engine, url)
    return engine, url
