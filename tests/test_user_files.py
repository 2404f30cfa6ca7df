"""Every file a user names on the command line (a suite, a price table, an A/B's JSON, a
bisection's state) is read through one guard: a FIFO, a device behind a link, a directory, a
file that is not UTF-8 or is too large is one line naming the file, exit 2, never a hang or a
traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpubench.cli import main
from gpubench.files import read_user_file

SUITE = 'name = "s"\n[defaults]\nworkload = "mlp"\n'


def _hostile(tmp_path: Path, kind: str, name: str) -> tuple[Path, str]:
    """A file of the kind, and what the one line says of it."""
    path = tmp_path / kind / name
    path.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(path)
        return path, "not a regular file (a FIFO, a device or a socket)"
    if kind == "zero":
        path.symlink_to("/dev/zero")
        return path, "not a regular file (a FIFO, a device or a socket)"
    if kind == "dir":
        path.mkdir()
        return path, "a directory; expected a file"
    path.write_bytes(b'name = "caf\xe9"\n')  # Latin-1
    return path, "line 1: not UTF-8 text (byte 0xe9)"


# each command's file option, as the command line gives it (the path last)
READERS = {
    "suite": (lambda p: ["run", str(p)], "suite", "s.toml"),
    "--price": (lambda p: ["run", "s.toml", "--price", str(p)], "--price", "prices.toml"),
    "--continue": (lambda p: ["ab", "s.toml", "--lockstep", "--budget", "60", "--continue", str(p)], "--continue",
                   "ab.json"),
    "bisect --resume": (lambda p: ["bisect", "--resume", str(p.parent)], "--resume", "bisect.json"),
}


@pytest.mark.parametrize("kind", ["fifo", "zero", "dir", "latin1"])
@pytest.mark.parametrize("reader", list(READERS))
def test_every_file_a_user_names_is_one_line_whatever_it_is(tmp_path, monkeypatch, capsys, kind, reader):
    args, what, name = READERS[reader]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(SUITE)
    path, says = _hostile(tmp_path, kind, name)
    assert main(args(path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"gpubench: error: {what} {path}: {says}" in err, err


def test_the_guard_reads_a_whole_file_and_refuses_one_over_its_limit(tmp_path):
    path = tmp_path / "f.toml"
    path.write_bytes(b"x" * 1000)
    assert read_user_file(path, "--x") == b"x" * 1000
    with pytest.raises(Exception, match=r"--x .*f\.toml: 1000 bytes, over the 999 bytes"):
        read_user_file(path, "--x", limit=999)
