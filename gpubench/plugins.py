"""Third-party workloads and backends.

A plugin is a module that calls ``register_workload`` / ``register_backend`` when imported.
It is found through the ``gpubench.plugins`` entry-point group (as pytest finds ``pytest11``
plugins) or named in the ``GPUBENCH_PLUGINS`` environment variable (comma-separated module
names), which also reaches the worker processes.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points

from gpubench.errors import InputError

ENV_VAR = "GPUBENCH_PLUGINS"


def load_plugins() -> list[str]:
    loaded = []
    for ep in entry_points(group="gpubench.plugins"):
        ep.load()
        loaded.append(ep.value)
    for name in filter(None, (m.strip() for m in os.environ.get(ENV_VAR, "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise InputError(f"{ENV_VAR}: cannot import plugin module {name!r}: {e}") from None
        loaded.append(name)
    return loaded
