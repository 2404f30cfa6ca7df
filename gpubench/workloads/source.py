"""Where a config's model comes from: a built-in workload, the user's factory, or a zoo.

``workload`` names one of three model sources:

- a built-in workload (``cnn``, ``mlp``, ``resnet18``...): a framework-neutral spec that every
  backend translates, identical in every framework by construction;
- the user's factory, ``"module:function"``: a plain function that returns the framework's own
  model (a ``torch.nn.Module``, a ``keras.Model``); its keyword arguments come from the suite's
  ``args.<name>`` keys;
- a model of a zoo by name, ``"torchvision:resnet50"``, ``"timm:<name>"``, ``"hf:<model type>"``
  (Hugging Face Transformers, built from the library's default config), ``"keras:ResNet50"``
  (keras.applications): random weights, nothing downloaded.

This module parses the names and imports the user's functions; it imports no framework. Each
backend turns a source into its native model (gpubench.backends.base.NativeModel).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubench.config import Config
from gpubench.files import write_text_atomic


@dataclass(frozen=True)
class Zoo:
    name: str  # (the framework whose models it makes says so: ``Backend.zoos``)
    package: str  # the import that must succeed
    install: str  # the pip line that installs it

    def unavailable(self) -> str:
        return f"{self.name}: models need the {self.package} package; install with: {self.install}"


ZOOS: dict[str, Zoo] = {z.name: z for z in (
    Zoo("torchvision", "torchvision", "pip install 'gpubench[torchvision]' (a torchvision that matches your "
                                      "PyTorch)"),
    Zoo("timm", "timm", "pip install 'gpubench[timm]'"),
    Zoo("hf", "transformers", "pip install 'gpubench[hf]'"),
    Zoo("keras", "keras", "pip install 'gpubench[tensorflow]' (keras.applications comes with Keras)"),
)}

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ZOO_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class ModelRef:
    """A parsed ``workload``: ``kind`` is ``builtin``, ``factory`` or ``zoo``; ``module`` is the
    factory's module or the zoo's name, ``name`` the function or the zoo's model."""

    text: str
    kind: str
    module: str = ""
    name: str = ""

    @property
    def zoo(self) -> Zoo | None:
        return ZOOS.get(self.module) if self.kind == "zoo" else None

    @property
    def label(self) -> str:
        """The model as config ids write it (no ``:``, which file names and ids avoid)."""
        return self.text.replace(":", ".").replace("/", "_") if self.kind != "builtin" else self.text


def parse_workload(text: str, builtins: list[str]) -> ModelRef:
    """The source ``text`` names; ValueError (the allowed forms named) when it names none."""
    if text in builtins:
        return ModelRef(text, "builtin")
    head, sep, tail = text.partition(":")
    forms = (f"expected one of: {', '.join(builtins)}; or a factory \"module:function\", or a zoo's model "
             f"\"zoo:name\" (zoos: {', '.join(ZOOS)})")
    if not sep:
        raise ValueError(f"unknown workload {text!r}; {forms}")
    if head in ZOOS:
        if not _ZOO_NAME.match(tail):
            raise ValueError(f"workload {text!r}: no model name after '{head}:'; {forms}")
        return ModelRef(text, "zoo", head, tail)
    if not _DOTTED.match(head) or not _DOTTED.match(tail):
        raise ValueError(f"workload {text!r} is not \"module:function\" (a dotted module path, a function name); "
                         f"{forms}")
    return ModelRef(text, "factory", head, tail)


def is_function_ref(text: str) -> bool:
    """Whether ``text`` is a ``module:function`` reference (the ``batches`` and ``loss`` keys)."""
    head, sep, tail = text.partition(":")
    return bool(sep) and bool(_DOTTED.match(head)) and bool(_DOTTED.match(tail))


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


def check_arguments(fn: Callable[..., Any], kwargs: dict[str, Any], ref: str) -> None:
    """SourceError when ``fn`` cannot take ``kwargs`` (the suite's ``args.*``)."""
    import inspect

    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as e:
        given = ", ".join(f"args.{k}" for k in kwargs) or "no arguments"
        raise SourceError(f"workload {ref!r}: the factory cannot be called with {given}: {e}") from None
    except ValueError:  # a builtin without a signature: the call itself will tell
        pass


def nearest(name: str, names: list[str], n: int = 5) -> str:
    """``; nearest: a, b, c`` (or a few of the names when none is close)."""
    near = difflib.get_close_matches(name, names, n=n, cutoff=0.5)
    if near:
        return f"; nearest: {', '.join(near)}"
    return f"; some of the {len(names)} names: {', '.join(sorted(names)[:n])}"


def code_origin(fn: Callable[..., Any]) -> dict[str, Any]:
    """Which code a factory came from: its file, the file's SHA-1, and the git commit of the
    repository it lies in (with ``dirty`` when that file differs from the commit)."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    out: dict[str, Any] = {"module": getattr(fn, "__module__", None), "function": getattr(fn, "__qualname__", None)}
    if not path:
        return out
    file = Path(path).resolve()
    out["file"] = str(file)
    try:
        out["file_sha1"] = hashlib.sha1(file.read_bytes()).hexdigest()
    except OSError:
        pass
    out.update(_git(file))
    return out


def _git(file: Path) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(file.parent), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    status = git("status", "--porcelain", "--", file.name)
    return {"git_commit": commit, "git_dirty": bool(status)}


__all__ = ["ZOOS", "ModelRef", "SourceError", "Zoo", "check_arguments", "code_origin",
           "import_function", "is_function_ref", "nearest", "parse_workload"]


def counted_once(directory: Path | None, config: Config, facts: dict[str, Any], framework_version: str,
                 count: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A factory's or a zoo's model's FLOP count (``count()``: the backend's), counted by the
    first worker of a run that builds the model and read back by the others from ``directory``
    (the run's; None: counted here). The count is one training step on the host at a fixed
    batch, the same for every config that builds the same model from the same code: every
    setting that reaches the model (not the batch, precision or device), the factory file's
    SHA-1 or the zoo's version and the framework's version make the key. Counting costs a
    worker seconds (PyTorch's FlopCounterMode imports its compiler stack, then steps the model
    on the host), which every repeat of every config paid again."""
    if directory is None:
        return count()
    key = {"workload": config.workload, "framework": config.framework, "params": config.workload_params,
           "input_shape": config.input_shape, "num_classes": config.num_classes, "batches": config.batches,
           "loss": config.loss, "seed": config.seed, "file_sha1": (facts.get("origin") or {}).get("file_sha1"),
           "zoo_version": facts.get("version"), "framework_version": framework_version}
    digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    path = directory / f"flops-{digest}.json"
    try:
        found = json.loads(path.read_text())
        if isinstance(found, dict) and "flops_per_sample" in found:
            return found
    except (OSError, ValueError):
        pass
    found = count()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(found))
    except OSError:  # a full disk or a read-only run directory: the next worker counts again
        pass
    return found
