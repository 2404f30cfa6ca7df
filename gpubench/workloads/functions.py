"""The user's own functions, named ``"module:function"`` in a suite (a factory, a batch, loss or
data set function): imported from the suite's directory or PYTHONPATH, and the one-line error a
function that cannot be used gives. Imports no framework and nothing else of gpubench's."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any


class SourceError(Exception):
    """A user's function that cannot be used: one line naming it and what was wrong."""


def import_function(ref: str, key: str) -> Callable[..., Any]:
    """The callable ``module:function`` names (``key``: the suite key, for the message)."""
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name) and e.name.split(".")[0] == module_name.split(".")[0]:
            raise SourceError(f"{key} {ref!r}: no module named {module_name!r} (looked in the suite's directory "
                              f"and on PYTHONPATH)") from None
        raise SourceError(f"{key} {ref!r}: importing {module_name} failed: {e}") from None
    except Exception as e:  # noqa: BLE001 - the user's module failed while importing: say how
        raise SourceError(f"{key} {ref!r}: importing {module_name} failed: {type(e).__name__}: {e}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None))]
            near = difflib.get_close_matches(attr, names, n=3)
            hint = f"; did you mean: {', '.join(near)}" if near else ""
            raise SourceError(f"{key} {ref!r}: module {module_name} has no {attr!r}{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SourceError(f"{key} {ref!r}: {attr} is a {type(obj).__name__}, not a function")
    return obj
