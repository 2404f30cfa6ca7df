"""Check a sweep's own models before any config runs: a factory that cannot be imported, is not
callable, takes other arguments, returns no model of its framework or one whose output does
not fit the data, a zoo name that does not exist, a batch or loss function that cannot be
imported. Each is one line naming the suite file, the key and what was wrong (InputError,
exit 2), before a run directory is made.

The models are built where they train: in a child process per framework (``python -m
gpubench.runner.models``, the configs as JSON on stdin), with the worker's own path to the
user's code, through the backend's ``native`` (what the worker calls first), so the check is the
worker's own and the parent imports no framework. It does not count the model's FLOPs (a training
step on the host, with PyTorch's compiler stack imported): the run's first worker does, once.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpubench.backends.base import Unsupported
from gpubench.config import Config
from gpubench.errors import InputError
from gpubench.launch import Launcher, dying_with_parent
from gpubench.workloads import WORKLOADS
from gpubench.workloads.source import model_key, parse_workload

CHECK_TIMEOUT_S = 600


def needs_user_code(config: Config) -> bool:
    """Whether the config imports the user's code: a factory, a batch or a loss function."""
    workload = parse_workload(config.workload, sorted(WORKLOADS))
    return workload.kind == "factory" or bool(config.batches) or ":" in config.loss


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


def check_models(configs: list[Config], source: str, launcher: Launcher, skip_frameworks: set[str]) -> None:
    """InputError for the first of the configs' own models that cannot be built (see the module
    docstring); built-in workloads, zoo models whose package is missing and frameworks in
    ``skip_frameworks`` (not installed: their configs end ``unavailable``) are not checked."""
    todo: dict[str, list[Config]] = {}
    for c in configs:
        if ":" not in c.workload or c.framework in skip_frameworks or zoo_unavailable(c):
            continue
        from gpubench.backends import get_backend

        if get_backend(c.framework).unsupported(c):  # the config ends unsupported, with its reason
            continue
        key = model_key(c)
        if key not in todo.setdefault(c.framework, []):
            todo[c.framework].append(key)
    for framework, keys in todo.items():
        problem = _check_in_child(framework, keys, launcher)
        if problem is not None:
            raise InputError(f"{source}: {problem}")


def _check_in_child(framework: str, keys: list[Config], launcher: Launcher) -> str | None:
    payload = json.dumps([k.to_dict() for k in keys])
    try:
        proc = subprocess.run(dying_with_parent(launcher.command("gpubench.runner.models")), input=payload,
                              capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, env=launcher.env())
    except OSError as e:
        return f"cannot start {launcher.python} to check the models: {e}"
    except subprocess.TimeoutExpired:
        return f"checking the {framework} models took longer than {CHECK_TIMEOUT_S} s"
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"checking the {framework} models failed: {tail}"
    answer = json.loads(lines[-1])
    return answer.get("problem")


def check_here(keys: list[dict[str, Any]]) -> str | None:
    """In the child: build each model as the worker would; the first problem, or None."""
    from gpubench.backends import get_backend

    for d in keys:
        config = Config.from_dict(d)
        backend = get_backend(config.framework)
        try:
            backend.native(config, count=False)  # the run counts the FLOPs, once (counted_once)
        except Unsupported:  # the config ends unsupported, with its reason, when it runs
            continue
        except ImportError as e:  # the framework or a package the user's module needs
            return f"workload {config.workload!r}: importing it failed: {e}"
        except Exception as e:  # noqa: BLE001 - every failure is the user's model's: say which and why
            text = str(e).splitlines()[0] if str(e) else ""
            named = text.startswith(("workload ", "batches ", "loss "))
            return text if named else f"workload {config.workload!r}: {type(e).__name__}: {text}"
    return None


def main() -> int:
    from gpubench.plugins import load_plugins

    load_plugins()
    keys = json.loads(sys.stdin.read())
    print(json.dumps({"problem": check_here(keys)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
