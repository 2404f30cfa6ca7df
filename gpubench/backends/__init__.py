"""The backend registry. Backends are imported lazily: naming one never imports its framework."""

from __future__ import annotations

from dataclasses import replace

from gpubench.backends.base import Backend
from gpubench.backends.registry import BACKENDS, declared, load_class, register_backend, zoo_framework
from gpubench.config import SETTING_FIELDS, Config
from gpubench.options import BEST_COMPILE, USER_FUNCTION, device_kind

# the framework every other one is compared against in reports ("JAX over PyTorch")
REFERENCE_FRAMEWORK = "torch"


def backend_class(name: str) -> type[Backend]:
    """The Backend class registered as ``name`` (its module is imported; its framework is not)."""
    return load_class(name)


# the built-in values of each setting whose values the backends declare (its declaration in
# gpubench.config: check ("declared", kind, values)), in the order the docs list them
_BUILT_IN: dict[str, tuple[str, ...]] = {
    f.name: f.metadata["check"][2] for f in SETTING_FIELDS
    if f.metadata["check"] and f.metadata["check"][0] in ("declared", "declared_or_function")}


def declared_values(setting: str) -> list[str]:
    """Every value of ``setting`` that some registered backend supports: what a suite may ask
    for (built-in values first, then any a plugin's backend adds; a user's function, which the
    suite checks as one, is not among them)."""
    declared = {v for name in BACKENDS for v in backend_class(name).capabilities.values(setting)} - {USER_FUNCTION}
    return [v for v in _BUILT_IN[setting] if v in declared] + sorted(declared - set(_BUILT_IN[setting]))


def get_backend(name: str) -> Backend:
    return backend_class(name)()


def resolve_best_compile(config: Config) -> Config:
    """A ``compile = "best"`` config as its framework's strongest mode that its rules allow
    (``Capabilities.best_compile``, first allowed; else ``none``); any other config as it is."""
    if config.compile != BEST_COMPILE:
        return config
    backend = get_backend(config.framework)
    for mode in backend.capabilities.best_compile.get(device_kind(config.device), ()):
        candidate = replace(config, compile=mode)
        if backend.unsupported(candidate) is None:
            return candidate
    return replace(config, compile="none")


def display_name(name: str) -> str:
    """The framework's name as reports print it (its backend's ``display_name``; the registry
    name where it sets none, or for a framework no longer registered)."""
    return declared(name, "display_name", "") or name


def uncompiled_note() -> str:
    """What ``compile = none`` means in each registered framework that says, in one clause
    ("PyTorch's is eager; JAX's is already one XLA program (jax.jit)")."""
    notes = {name: declared(name, "uncompiled", "") for name in BACKENDS}
    return "; ".join(f"{display_name(name)}'s is {how}" for name, how in notes.items() if how)


def colour(name: str, precision: str) -> str:
    """The chart colour of a framework at a precision (grey where its backend sets none)."""
    colours: dict[str, str] = declared(name, "colours", {})
    return colours.get(precision, "#7f7f7f")


__all__ = ["BACKENDS", "REFERENCE_FRAMEWORK", "Backend", "backend_class", "colour", "declared_values", "display_name",
           "get_backend", "register_backend", "uncompiled_note", "zoo_framework"]
