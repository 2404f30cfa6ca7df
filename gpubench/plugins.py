"""Third-party workloads and backends.

A plugin is a module that calls ``register_workload`` / ``register_backend`` when imported.
It is found through the ``gpubench.plugins`` entry-point group (as pytest finds ``pytest11``
plugins) or named in the ``GPUBENCH_PLUGINS`` environment variable (comma-separated module
names), which also reaches the worker processes.
"""

from __future__ import annotations

import importlib
import os
import traceback
from importlib.metadata import entry_points

from gpubench.errors import InputError

ENV_VAR = "GPUBENCH_PLUGINS"


def load_plugins() -> list[str]:
    """Import every plugin; one that fails to import (whatever it raises) is an InputError
    naming it and its exception, so a broken plugin is one line, not a traceback."""
    loaded = []
    for ep in entry_points(group="gpubench.plugins"):
        try:
            ep.load()
        except Exception as e:  # noqa: BLE001 - a plugin's import can raise anything
            raise InputError(f"entry point {ep.name!r} = {ep.value!r} (group gpubench.plugins): cannot load plugin: "
                             f"{_describe(e)}") from None
        loaded.append(ep.value)
    for name in filter(None, (m.strip() for m in os.environ.get(ENV_VAR, "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise InputError(f"{ENV_VAR}: cannot import plugin module {name!r}: {e}") from None
        except Exception as e:  # noqa: BLE001
            raise InputError(f"{ENV_VAR}: plugin module {name!r} failed to import: {_describe(e)}") from None
        loaded.append(name)
    return loaded


def _describe(e: BaseException) -> str:
    """``RuntimeError: boom (at /path/plugin.py:3)``: the exception, its first line, and where
    it was raised."""
    text = (str(e).strip().splitlines() or [""])[0]
    frames = traceback.extract_tb(e.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}{': ' + text if text else ''}{where}"
