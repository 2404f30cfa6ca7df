"""The registry of backends by name, and what needs only the registry: a backend's class
(imported by name; its framework is not), and which framework trains a zoo's models. The
Backend base class reads it lazily (a zoo of another framework's models), so this module
imports no backend module at load time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, TypeVar

from gpubench.errors import choices_message
from gpubench.options import MESH_FRAMEWORKS, RankStart

if TYPE_CHECKING:
    from gpubench.config import Config

# name -> "module:Class"; plugins add to it with register_backend.
BACKENDS: dict[str, str] = {
    "torch": "gpubench.backends.pytorch.backend:TorchBackend",
    "tensorflow": "gpubench.backends.tensorflow.backend:TensorFlowBackend",
    "jax": "gpubench.backends.jax.backend:JaxBackend",
}


# the built-in backends that run fsdp:N in one process over a mesh (options.MESH_FRAMEWORKS)
MESH_FRAMEWORKS.add("jax")


def register_backend(name: str, target: str, mesh: bool = False) -> None:
    """A backend by name (``module:Class``, imported when first used); ``mesh``: it runs the
    sharded kinds (``fsdp:N``, ``tp:N``, ``fsdp:A+tp:B``) in one process over a mesh of N devices
    (``options.MESH_FRAMEWORKS``)."""
    BACKENDS[name] = target
    if mesh:
        MESH_FRAMEWORKS.add(name)


def load_class(name: str) -> Any:
    """The class registered as ``name`` (its module is imported; its framework is not)."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise KeyError(choices_message("framework", name, sorted(BACKENDS))) from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


T = TypeVar("T")


def declared(name: str, attribute: str, default: T) -> T:
    """What the backend registered as ``name`` sets as ``attribute``; ``default`` where it sets
    none, or where it cannot be loaded (a framework no longer registered, a plugin's module gone)."""
    try:
        return getattr(load_class(name), attribute, default)
    except (KeyError, ImportError, AttributeError):
        return default


def zoo_framework(zoo: str) -> str | None:
    """The registered framework whose backend trains the models of ``zoo`` (``Backend.zoos``)."""
    return next((name for name in BACKENDS if zoo in declared(name, "zoos", ())), None)


def rank_start(config: Config) -> RankStart:
    """How the processes of a distributed config start, as its framework's backend declares it
    (``Capabilities.rank_start``; a kind it does not name: every rank a process of its own)."""
    return load_class(config.framework).capabilities.rank_start.get(config.parallel.kind, RankStart())
