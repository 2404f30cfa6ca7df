"""The registry of backends by name, and what needs only the registry: a backend's class
(imported by name; its framework is not), and which framework trains a zoo's models. The
Backend base class reads it lazily (a zoo of another framework's models), so this module
imports no backend module at load time.
"""

from __future__ import annotations

import importlib
from typing import Any

from gpubench.errors import choices_message
from gpubench.options import RankStart, parse_parallelism

# name -> "module:Class"; plugins add to it with register_backend.
BACKENDS: dict[str, str] = {
    "torch": "gpubench.backends.pytorch.backend:TorchBackend",
    "tensorflow": "gpubench.backends.tensorflow.backend:TensorFlowBackend",
    "jax": "gpubench.backends.jax.backend:JaxBackend",
}


def register_backend(name: str, target: str) -> None:
    BACKENDS[name] = target


def load_class(name: str) -> Any:
    """The class registered as ``name`` (its module is imported; its framework is not)."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise KeyError(choices_message("framework", name, sorted(BACKENDS))) from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


def zoo_framework(zoo: str) -> str | None:
    """The registered framework whose backend trains the models of ``zoo`` (``Backend.zoos``)."""
    for name in BACKENDS:
        try:
            if zoo in getattr(load_class(name), "zoos", ()):
                return name
        except (KeyError, ImportError, AttributeError):
            continue
    return None


def rank_start(framework: str, parallelism: str) -> RankStart:
    """How the processes of a distributed config start, as its framework's backend declares it
    (``Capabilities.rank_start``; a kind it does not name: every rank a process of its own)."""
    kind = parse_parallelism(parallelism)[0]
    return load_class(framework).capabilities.rank_start.get(kind, RankStart())
