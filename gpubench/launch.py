"""How a child process is started: which Python, and where it finds gpubench.

Below the runner and the calibration alike (both start children), so neither imports the other
for it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import gpubench

_PKG_ROOT = str(Path(gpubench.__file__).resolve().parent.parent)


def child_env() -> dict[str, str]:
    """The parent's environment, with this gpubench importable (also when run as
    ``PYTHONPATH=. python -m gpubench`` from a checkout)."""
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if _PKG_ROOT not in parts:
        env["PYTHONPATH"] = os.pathsep.join([_PKG_ROOT, *parts])
    return env


@dataclass(frozen=True)
class Launcher:
    """How to start a child: which Python, and where it finds gpubench. The default is this
    interpreter and this gpubench; ``gpubench ab`` launches two different ones."""

    python: str = sys.executable
    pythonpath: str | None = None  # a checkout whose gpubench the child imports instead of this one

    def env(self) -> dict[str, str]:
        if self.pythonpath is None:
            return child_env()
        env = dict(os.environ)
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != _PKG_ROOT]
        env["PYTHONPATH"] = os.pathsep.join([self.pythonpath, *parts])
        return env

    def command(self, module: str, *args: str) -> list[str]:
        return [self.python, "-m", module, *args]
