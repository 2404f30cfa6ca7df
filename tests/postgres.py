"""A throw-away PostgreSQL server for the history tests, started from the machine's own
binaries (initdb and pg_ctl into a temporary directory; as the ``postgres`` user where the
tests run as root, since PostgreSQL refuses to run as root), on a free local port, with
fsync off. Where no binaries exist the PostgreSQL tests skip with the reason, unless
GPUBENCH_REQUIRE_POSTGRES=1 (set by .ci/run), which makes that a failure."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REQUIRE = "GPUBENCH_REQUIRE_POSTGRES"


def pg_bin() -> Path | None:
    """The newest PostgreSQL's bin directory with initdb and pg_ctl (Debian's layout first)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="gpubench-pg-"))
        self.data, self.log = self.root / "data", self.root / "server.log"
        self.port = _free_port()
        self.user = None
        if os.geteuid() == 0:  # PostgreSQL will not run as root: the postgres account runs it
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root and there is no 'postgres' user to run PostgreSQL as") from None
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)

    def _run(self, *args: str) -> None:
        kw = {"user": self.user.pw_uid, "group": self.user.pw_gid} if self.user else {}
        proc = subprocess.run([str(self.bindir / args[0]), *args[1:]], capture_output=True, text=True, timeout=120,
                              cwd=self.root, **kw)
        if proc.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stderr.strip()} {log[-2000:]}")

    def start(self) -> PostgresServer:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "gpubench", "--no-sync", "-E", "UTF8")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o",
                  f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                  "-c synchronous_commit=off -c full_page_writes=off", "start")
        return self

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://gpubench@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def postgres_server() -> Iterator[PostgresServer]:
    bindir = pg_bin()
    if bindir is None:
        reason = "no PostgreSQL binaries (initdb, pg_ctl): apt-get install postgresql"
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1 and {reason}")
        pytest.skip(reason)
    server = PostgresServer(bindir).start()
    try:
        yield server
    finally:
        server.stop()
