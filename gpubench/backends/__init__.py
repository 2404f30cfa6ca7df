"""The backend registry. Backends are imported lazily: naming one never imports its framework."""

from __future__ import annotations

import importlib

from gpubench.backends.base import Backend
from gpubench.errors import choices_message

# name -> "module:Class"; plugins add to it with register_backend.
BACKENDS: dict[str, str] = {
    "torch": "gpubench.backends.pytorch.backend:TorchBackend",
    "tensorflow": "gpubench.backends.tensorflow.backend:TensorFlowBackend",
}


def register_backend(name: str, target: str) -> None:
    BACKENDS[name] = target


def get_backend(name: str) -> Backend:
    try:
        target = BACKENDS[name]
    except KeyError:
        raise KeyError(choices_message("framework", name, sorted(BACKENDS))) from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)()
