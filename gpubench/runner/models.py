"""Check a sweep's own models and data before any config runs: a factory that cannot be
imported, is not callable, takes other arguments, returns no model of its framework or one whose
output does not fit the data, a zoo name that does not exist, a batch or loss function that
cannot be imported, a data set function that returns no split of a known form (or splits that do
not fit each other or the model). Each is one line naming the suite file, the key and what was
wrong (InputError, exit 2), before a run directory is made.

The models are built where they train: in a child process per framework (``python -m
gpubench.runner.models IN OUT``: the configs as JSON in the file IN, the answer in the file OUT,
never on stdout, which the user's code may write to), with the worker's own path to the user's
code, through the backend's ``native`` (what the worker calls first), so the check is the
worker's own and the parent imports no framework. The child runs in a process group of its own,
its output in a file (a background process the factory starts cannot hold a pipe open), within
the configs' ``timeout_s``; the group is killed when the check ends or passes its limit, and a
check that ends without an answer names the workload it was building and its exit code. It
does not count the model's FLOPs (a training step on the host, with PyTorch's compiler stack
imported): the run's first worker does, once.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpubench.backends import get_backend
from gpubench.backends.base import Unsupported
from gpubench.config import Config
from gpubench.errors import InputError
from gpubench.files import write_text_atomic
from gpubench.launch import Interpreter, dying_with_parent
from gpubench.runner.process import kill_group
from gpubench.workloads import WORKLOADS
from gpubench.workloads.source import model_key, parse_workload


def needs_user_code(config: Config) -> bool:
    """Whether the config imports the user's code: a factory, a batch, loss or data set function."""
    workload = parse_workload(config.workload, sorted(WORKLOADS))
    return workload.kind == "factory" or bool(config.batches) or ":" in config.loss or ":" in config.dataset


def user_code_path(configs: list[Config], suite_source: str) -> tuple[str, ...]:
    """The suite file's directory, where its configs import the user's code from (then PYTHONPATH)."""
    if not any(needs_user_code(c) for c in configs):
        return ()
    return (str(Path(suite_source).resolve().parent),)


def zoo_unavailable(config: Config) -> str | None:
    """Why a zoo's model cannot be built here (its package is missing; found without importing it)."""
    if ":" not in config.workload:
        return None
    zoo = parse_workload(config.workload, sorted(WORKLOADS)).zoo
    if zoo is None or importlib.util.find_spec(zoo.package) is not None:
        return None
    return zoo.unavailable()


def check_models(configs: list[Config], source: str, launcher: Interpreter, skip_frameworks: set[str]) -> None:
    """InputError for the first of the configs' own models that cannot be built (see the module
    docstring); built-in workloads, zoo models whose package is missing and frameworks in
    ``skip_frameworks`` (not installed: their configs end ``unavailable``) are not checked."""
    todo: dict[str, list[Config]] = {}
    limit: dict[str, float] = {}  # per framework: the longest timeout_s of its configs
    for c in configs:
        if (":" not in c.workload and ":" not in c.dataset) or c.framework in skip_frameworks or zoo_unavailable(c):
            continue
        if get_backend(c.framework).unsupported(c):  # the config ends unsupported, with its reason
            continue
        key = model_key(c)
        limit[c.framework] = max(limit.get(c.framework, 0.0), c.timeout_s)
        if key not in todo.setdefault(c.framework, []):
            todo[c.framework].append(key)
    for framework, keys in todo.items():
        problem = _check_in_child(framework, keys, launcher, limit[framework])
        if problem is not None:
            raise InputError(f"{source}: {problem}")


def _check_in_child(framework: str, keys: list[Config], launcher: Interpreter, limit_s: float) -> str | None:
    with tempfile.TemporaryDirectory(prefix="gpubench-check-") as tmp:
        given, answer, output = Path(tmp) / "configs.json", Path(tmp) / "answer.json", Path(tmp) / "output.txt"
        given.write_text(json.dumps([k.to_dict() for k in keys]))
        with open(output, "wb") as out:
            try:
                proc = subprocess.Popen(dying_with_parent(launcher.command("gpubench.runner.models", str(given),
                                                                           str(answer))),
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True, env=launcher.env())
            except OSError as e:
                return f"cannot start {launcher.python} to check the models: {e}"
            try:
                proc.wait(timeout=limit_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            kill_group(proc, grace_s=1.0)  # and what the user's code started in the background
        said = _answer(answer)
        building = f"building workload {said['building']!r}" if isinstance(said.get("building"), str) else ""
        if timed_out:
            return (f"checking the {framework} models: {building or 'the check'} took longer than {limit_s:g} s "
                    "(the configs' timeout_s); stopped")
        if "problem" in said:
            return str(said["problem"]) if said["problem"] is not None else None
        tail = (output.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
        return (f"checking the {framework} models failed: the check ended with exit code {proc.returncode}"
                + (f" while {building}" if building else "") + f" ({tail})")


def _answer(path: Path) -> dict[str, Any]:
    """The child's answer file: ``{"building": workload}`` as it goes, ``{"problem": ...}`` at the
    end; {} where it wrote none."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def check_here(keys: list[dict[str, Any]], progress: Callable[[str], None] | None = None) -> str | None:
    """In the child: build each model as the worker would; the first problem, or None.
    ``progress`` is told each workload before it is built."""
    for d in keys:
        config = Config.from_dict(d)
        backend = get_backend(config.framework)
        if progress is not None:
            progress(config.workload)
        try:
            backend.native(config, count=False)  # the run counts the FLOPs, once (counted_once)
        except Unsupported:  # the config ends unsupported, with its reason, when it runs
            continue
        except SystemExit as e:  # the factory (or its module) ended the process
            return f"workload {config.workload!r}: called sys.exit({e.code!r}) while it was built"
        except ImportError as e:  # the framework or a package the user's module needs
            return f"workload {config.workload!r}: importing it failed: {e}"
        except Exception as e:  # noqa: BLE001 - every failure is the user's model's: say which and why
            text = str(e).splitlines()[0] if str(e) else ""
            named = text.startswith(("workload ", "batches ", "loss ", "dataset ", "held_out "))
            return text if named else f"workload {config.workload!r}: {type(e).__name__}: {text}"
    return None


def main(argv: list[str]) -> int:
    from gpubench.plugins import load_plugins

    given, answer = Path(argv[0]), Path(argv[1])

    def say(what: dict[str, Any]) -> None:
        write_text_atomic(answer, json.dumps(what))

    load_plugins()
    keys = json.loads(given.read_text())
    say({"problem": check_here(keys, lambda workload: say({"building": workload}))})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
