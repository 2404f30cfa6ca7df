"""Ask a framework about itself in a throw-away process.

``python -m gpubench.runner.probe NAME`` prints one JSON ProbeInfo. Running it in a child
keeps the parent free of framework imports and CUDA contexts, and lets the parent mark a
config ``unavailable`` without starting a worker for it.
"""

from __future__ import annotations

import json
import subprocess
import sys

from gpubench.backends import get_backend
from gpubench.backends.base import ProbeInfo
from gpubench.launch import Interpreter, dying_with_parent

PROBE_TIMEOUT_S = 180


def probe_here(name: str) -> ProbeInfo:
    backend = get_backend(name)
    try:
        return backend.probe()
    except ImportError as e:
        return ProbeInfo(name, False, reason=f"{name} is not installed ({e}); install with: {backend.install_hint}")


def probe(name: str, launcher: Interpreter = Interpreter()) -> ProbeInfo:
    """Probe a framework in a child process (never raises)."""
    try:
        proc = subprocess.run(dying_with_parent(launcher.command("gpubench.runner.probe", name)), capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, env=launcher.env())
    except OSError as e:
        return ProbeInfo(name, False, reason=f"cannot start {launcher.python}: {e}")
    except subprocess.TimeoutExpired:
        return ProbeInfo(name, False, reason=f"probing {name} took longer than {PROBE_TIMEOUT_S} s")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return ProbeInfo(name, False, reason=f"probing {name} failed: {tail}")
    return ProbeInfo.from_dict(json.loads(lines[-1]))


def main(argv: list[str]) -> int:
    from gpubench.plugins import load_plugins

    load_plugins()
    print(json.dumps(probe_here(argv[0]).to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
