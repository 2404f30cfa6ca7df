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

import contextlib
import difflib
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from gpubench.config import Config
from gpubench.errors import did_you_mean
from gpubench.files import write_text_atomic
from gpubench.workloads.data import (
    Batches,
    SyntheticTask,
    eval_batch_count,
    eval_batches,
    function_batches,
    one_batch,
    pool_maker,
    train_draw,
    tree_leaves,
)
from gpubench.workloads.dataset import split_pool, splits
from gpubench.workloads.functions import SourceError, import_function


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
        raise ValueError(f"unknown workload {text!r}{did_you_mean(text, builtins)}; {forms}")
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
    with contextlib.suppress(OSError):
        out["file_sha1"] = hashlib.sha1(file.read_bytes()).hexdigest()
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


# --- a model that is not a built-in meets its task: the checks of the pre-run build --------------
# Framework-neutral: each backend runs the model forward on one small batch and hands the shapes
# and values here, so that every framework refuses the same mistakes with the same line.

FIRST_BATCH = 2  # the samples of the batch a model is first run on, checked and counted
# what a model whose output does not fit gpubench's cross-entropy can do instead
CHOICES = ('a batch function whose targets fit the output (batches = "module:function"), the loss the model computes '
           '(loss_output = "<field>" or a tuple\'s position), or your loss (loss = "module:function")')


def describe(out: Any, depth: int = 0) -> str:
    """A model's output in a few words: each array's shape, in the structure it came in."""
    shape = getattr(out, "shape", None)
    if shape is not None and not isinstance(out, (tuple, list, Mapping)):
        return f"{type(out).__name__} {list(shape)}"
    if depth > 2:
        return type(out).__name__
    if isinstance(out, Mapping):
        inner = ", ".join(f"{k}: {describe(v, depth + 1)}" for k, v in list(out.items())[:6])
        return f"{type(out).__name__} {{{inner}}}"
    if isinstance(out, (tuple, list)):
        return f"{type(out).__name__} ({', '.join(describe(v, depth + 1) for v in out[:6])})"
    fields = getattr(out, "__dataclass_fields__", None)
    if fields:
        inner = ", ".join(f"{k}: {describe(getattr(out, k, None), depth + 1)}" for k in list(fields)[:6])
        return f"{type(out).__name__} {{{inner}}}"
    return type(out).__name__


def output_field(out: Any, name: str) -> Any:
    """The part of a model's output ``loss_output`` names: a tuple's position (digits), else a
    key of a mapping (a Hugging Face output is one) or an attribute (a dataclass's field)."""
    if name.isdigit():
        if isinstance(out, (tuple, list)) and int(name) < len(out) and out[int(name)] is not None:
            return out[int(name)]
    elif isinstance(out, Mapping):
        if out.get(name) is not None:
            return out[name]
    elif getattr(out, name, None) is not None:
        return getattr(out, name)
    what = f"position {name}" if name.isdigit() else f"field {name!r}"
    raise SourceError(f"loss_output = {name!r}: the model's output has no {what} holding a loss; it returned "
                      f"{describe(out)}")


def config_loss(config: Config) -> Callable[[Any, Any], Any] | None:
    """The loss a config of a model that is not a built-in trains with, in gpubench's order
    ``(outputs, targets)``: the user's function, the model's own (``loss_output``), or None
    (the framework's cross-entropy)."""
    if config.loss_output:
        if parse_workload(config.workload, []).zoo is not None:
            raise SourceError(f"workload {config.workload!r}: loss_output applies to your factory's model, which "
                              "takes the targets as you wrote it; a zoo's model trains with gpubench's loss or yours")
        if config.loss != "cross_entropy":
            raise SourceError(f"workload {config.workload!r}: loss = {config.loss} and loss_output = "
                              f"{config.loss_output!r}: the model's own loss or yours, not both")
        return lambda out, _targets: output_field(out, config.loss_output)  # the targets went in with the inputs
    return import_function(config.loss, "loss") if config.loss != "cross_entropy" else None


def own_batches(task: SyntheticTask | None, batch_fn: Callable[[int], Any] | None, config: Config,
                facts: dict[str, Any] | None = None, data: dict[str, Any] | None = None
                ) -> tuple[Callable[[int, int], Batches], Batches, Callable[[int], Batches] | None]:
    """(``make_batches(batch, group)``, one batch of 2 for the pre-run checks and the FLOP count,
    ``held_out(batch)``: a target's held-out batches, None where there are none) of a model that
    is not a built-in: a data set's epochs and held-out split (``data``, NativeModel.data, gets
    what its pool holds), the batch function's (held out: its later calls, at least EVAL_SAMPLES
    samples), else the synthetic task's (a target's repeat trains on its own draw; held out: the
    task's held-out draw); with ``loss_output`` and no batch function, the targets go in after
    the inputs. Inputs that are token ids (integer arrays of (batch, T), every one of the same
    T) put ``tokens_per_sample`` T in ``facts``: its results have tokens/s."""
    held_out: Callable[[int], Batches] | None
    if config.dataset != "synthetic":  # a data set of samples: its epochs, its held-out split
        make, held_out = split_pool(config, {} if data is None else data)
        train = splits(config)[0]
        sample = Batches(x=train.x[None, :FIRST_BATCH], y=train.y[None, :FIRST_BATCH])
        if facts is not None and train.x.dtype.kind in "iu" and train.x.ndim == 2:
            facts["tokens_per_sample"] = int(train.x.shape[1])
        return make, sample, held_out
    make = pool_maker(task, batch_fn, config.batches, config.seed, train_draw(config.trial))
    if batch_fn is None:
        assert task is not None  # no batch function: the synthetic task
        sample = one_batch(task, FIRST_BATCH, config.seed)
        held_out = partial(eval_batches, task, seed=config.seed)
    else:
        held_out = lambda batch: function_batches(  # noqa: E731
            batch_fn, batch, eval_batch_count(batch), f"batches {config.batches!r}")
        sample = function_batches(batch_fn, FIRST_BATCH, 1, f"batches {config.batches!r}")
        lengths = {leaf.shape[2] for leaf in tree_leaves(sample.x) if leaf.ndim == 3 and leaf.dtype.kind in "iu"}
        if facts is not None and len(lengths) == 1:
            facts["tokens_per_sample"] = int(lengths.pop())
    if not config.loss_output or batch_fn is not None:
        return make, sample, held_out
    held = held_out
    return ((lambda batch, group: targets_in_inputs(make(batch, group))), targets_in_inputs(sample),
            lambda batch: targets_in_inputs(held(batch)))


def targets_in_inputs(batches: Batches) -> Batches:
    """Batches whose inputs carry the targets after them, for a model that computes its own loss
    (``model(x, y)``): the inputs become the pair (inputs, targets)."""
    return Batches(x=(batches.x, batches.y), y=batches.y)


def check_scores(workload: str, out: Any, scores: tuple[int, ...], targets: tuple[int, ...]) -> None:
    """SourceError unless the model's scores fit gpubench's cross-entropy against the targets:
    (batch, classes) for (batch,), or (batch, time, vocabulary) for (batch, time)."""
    if len(scores) == len(targets) + 1 and tuple(scores[:-1]) == tuple(targets):
        return
    raise SourceError(f"workload {workload!r}: the model's scores {list(scores)} do not fit the targets "
                      f"{list(targets)} (cross_entropy takes (batch, classes) for (batch,), or (batch, time, "
                      f"vocabulary) for (batch, time)); it returned {describe(out)}; use {CHOICES}")


def check_first_batch(config: Config, task: SyntheticTask | None, forward: Callable[[], Any],
                      scores_of: Callable[[Any], tuple[int, ...] | None], loss: Callable[[Any], Any], own: bool,
                      targets: tuple[int, ...] | None) -> None:
    """The model on its first batch of 2, before any config trains (each backend's ``forward()``
    of the batch, ``scores_of(output)``: the shape of its scores or None, and ``loss(output)``:
    the config's loss against the batch's targets, of shape ``targets`` or a structure: None):
    SourceError, the pre-run check's one line, where it takes not the inputs, where the loss
    fails on its output or is not one finite number, or where its scores do not fit the task."""
    try:
        out = forward()
    except Exception as e:  # noqa: BLE001 - the model rejects the input: say which
        raise input_problem(config, task, e) from None
    scores = scores_of(out)
    try:
        raw = loss(out)
    except SourceError as e:  # loss_output names nothing the model returned
        raise SourceError(f"workload {config.workload!r}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the loss fails on the output: say how
        raise loss_problem(config, out, scores, targets, e) from None
    try:
        value = loss_value(raw)
    except (TypeError, ValueError):
        raise SourceError(f"workload {config.workload!r}: {_loss_named(config)}: gave {describe(raw)}; a loss is one "
                          "number (a scalar)") from None
    _check_first_output(config, task, out, value, scores, own)


def _loss_named(config: Config) -> str:
    return f"loss_output = {config.loss_output!r}" if config.loss_output else f"loss {config.loss!r}"


def _check_first_output(config: Config, task: SyntheticTask | None, out: Any, loss: tuple[tuple[int, ...], float],
                        scores: tuple[int, ...] | None, own: bool) -> None:
    """SourceError, the pre-run check's one line, unless what a model gave on its first batch of
    2 can train: ``loss`` (its shape, its first value) one finite number where it is the user's
    or the model's own (``own``); on gpubench's synthetic data (``task``) the scores (their
    shape) also fit the task's targets and its classes (a vocabulary: at least its size)."""
    if own:
        check_loss(config, *loss)
        return
    if task is None and config.dataset != "synthetic" and scores:  # a data set's labels: every one a class scored
        train, held = splits(config)
        classes = max(train.classes, held.classes if held is not None else 0)
        if classes > scores[-1]:
            raise SourceError(f"dataset {config.dataset!r}: a class label {classes - 1}, but the model scores "
                              f"{scores[-1]} classes (its output {describe(out)})")
    if task is None:  # the batch function's or data set's targets, which the framework's cross-entropy took
        return
    if scores is None:
        raise SourceError(f"workload {config.workload!r}: the model returned {describe(out)}, which holds no "
                          f"scores; use {CHOICES}")
    targets = (FIRST_BATCH, *task.input_shape) if task.kind == "tokens" else (FIRST_BATCH,)
    check_scores(config.workload, out, scores, targets)
    n = scores[-1]
    if n < task.num_classes or (task.kind != "tokens" and n != task.num_classes):
        per = "position" if task.kind == "tokens" else "sample"
        raise SourceError(f"workload {config.workload!r}: the model gives {n} scores per {per}; num_classes = "
                          f"{task.num_classes}")


def loss_problem(config: Config, out: Any, scores: tuple[int, ...] | None, targets: tuple[int, ...] | None,
                 error: BaseException) -> SourceError:
    """The one line for a loss that fails on the model's first output: the user's (what it was
    given), or the framework's cross-entropy (the scores against the targets, and the choices)."""
    text = str(error).splitlines()[0] if str(error) else ""
    if config.loss_output or config.loss != "cross_entropy":
        return SourceError(f"workload {config.workload!r}: {_loss_named(config)} failed on the model's output "
                           f"({describe(out)}): "
                           f"{type(error).__name__}: {text}")
    if scores is None:
        return SourceError(f"workload {config.workload!r}: the model returned {describe(out)}, which holds no "
                           f"scores; use {CHOICES}")
    if targets is not None:
        try:
            check_scores(config.workload, out, scores, targets)
        except SourceError as e:
            return e
    return SourceError(f"workload {config.workload!r}: cross_entropy failed on the scores {list(scores)} and the "
                       f"targets {list(targets) if targets is not None else 'of the batch function'}: "
                       f"{type(error).__name__}: {text}; use {CHOICES}")


def loss_value(value: Any) -> tuple[tuple[int, ...], float]:
    """A loss as (its shape, its first value as a float; nan where it holds none), from any
    framework's array or a number; TypeError for what is neither (a tuple, a dict)."""
    array = np.asarray(value.detach().float().cpu() if hasattr(value, "detach") else value, dtype=np.float64)
    return tuple(array.shape), float(array.reshape(-1)[0]) if array.size else math.nan


def probe_scores(config: Config, x: np.ndarray, tokens: bool, run: Callable[[Any], Any],
                 scores_of: Callable[[Any], tuple[int, ...] | None]) -> tuple[int, ...] | BaseException | None:
    """The shape of a model's scores on the batch ``x`` (``run(inputs)``: the framework's forward
    pass; ``scores_of(output)``: its scores' shape or None), before the task is known. A model
    that computes its own loss (``loss_output``) is also called with zero targets after ``x``,
    of each shape they may have (a class per position of a sequence, a class per sample), the
    first way that works giving the answer. None where the output holds no scores; the first
    call's error where no way works."""
    targets: list[Any] = [None]
    if config.loss_output:
        per_sample = np.zeros((x.shape[0],), np.int64)
        targets += [np.zeros(x.shape, np.int64), per_sample] if tokens else [per_sample]
    first: BaseException | None = None
    for y in targets:
        try:
            out = run(x if y is None else (x, y))
        except Exception as e:  # noqa: BLE001 - not this way: the next one, or say why
            first = first or e
            continue
        return scores_of(out)
    return first


def check_loss(config: Config, shape: tuple[int, ...], value: float) -> None:
    """SourceError unless the loss of one batch (a user's ``loss`` or ``loss_output``'s) is one
    finite number."""
    what = f"workload {config.workload!r}: {_loss_named(config)}"
    if math.prod(shape) != 1:
        raise SourceError(f"{what}: gave an array of shape {list(shape)} for a batch of {FIRST_BATCH}; a loss is one "
                          "number (a scalar: take the mean over the batch)")
    if not math.isfinite(value):
        raise SourceError(f"{what}: gave {value} for a batch of {FIRST_BATCH} at the initial weights; a loss must "
                          "be finite")


def token_task(config: Config, shape: tuple[int, ...], vocab: int | None, first: str,
               scores: tuple[int, ...] | None, notes: list[str]) -> SyntheticTask | None:
    """The task of token ids a factory's model of input ``shape`` trains on, or None (features):
    where ``input_kind`` says tokens, or (``auto``) where the model's first layer is an embedding
    (``first``, of ``vocab`` rows; None: no embedding), said in ``notes``. ``scores``: the shape
    of the model's scores on 2 sequences of token ids (None: it gave none). Scores per position
    make the next-token task over a vocabulary of ``num_classes`` (else the embedding's rows and
    the scores', the fewer); scores per sequence a class per sequence (``num_classes``, else the
    scores')."""
    if config.input_kind == "features" or (config.input_kind == "auto" and (vocab is None or scores is None)):
        return None  # (auto: an embedding first that takes no token ids is some other model's: features)
    if len(shape) != 1:
        if config.input_kind == "auto":
            return None
        raise SourceError(f"workload {config.workload!r}: input_kind = tokens takes input_shape = [T], a "
                          f"sequence's length; got {list(shape)}")
    if scores is not None and len(scores) == 2:
        classes = config.num_classes or scores[-1]
        if not vocab:
            raise SourceError(f"workload {config.workload!r}: input_kind = tokens: the model gives a class per "
                              "sequence, and its vocabulary is unknown (its first layer is no embedding); name a "
                              'batch function (batches = "module:function")')
        task = SyntheticTask(shape, classes, kind="sequences", vocab=vocab)
        what = f"a class of {classes} per sequence of {shape[0]} tokens over a vocabulary of {vocab}"
    else:
        known = [n for n in (vocab, scores[-1] if scores else None) if n]
        size = config.num_classes or (min(known) if known else 0)
        if not size:
            raise SourceError(f"workload {config.workload!r}: input_kind = tokens: set num_classes (the vocabulary)")
        task = SyntheticTask(shape, size, kind="tokens")
        what = f"next-token prediction over sequences of {shape[0]} tokens of a vocabulary of {size}"
    if config.input_kind == "auto":
        notes.append(f"input_kind = auto: the model's first layer is an embedding ({first}), so it trains on "
                     f"integer token ids: {what}; input_kind = \"features\" gives it float arrays")
    return task


def input_problem(config: Config, task: SyntheticTask | None, error: BaseException) -> SourceError:
    """The one line for a model that fails on its first batch."""
    text = str(error).splitlines()[0] if str(error) else ""
    if task is None:
        what = f"the batches of {config.batches!r}" if config.batches else f"the samples of dataset {config.dataset!r}"
    elif task.kind == "tokens":
        what = f"integer token batches of shape [{FIRST_BATCH}, {task.input_shape[0]}] (input_kind = tokens)"
    else:
        what = f"input_shape {list(task.input_shape)} (batch first)"
    hint = ('; a model of token ids takes input_kind = "tokens"' if task is not None and task.kind == "classes"
            and len(task.input_shape) == 1 and config.input_kind != "features" else "")
    return SourceError(f"workload {config.workload!r}: the model does not take {what}: {type(error).__name__}: "
                       f"{text}{hint}")


__all__ = ["CHOICES", "FIRST_BATCH", "MODEL_SETTINGS", "ZOOS", "ModelRef", "SourceError", "Zoo", "check_arguments",
           "check_first_batch", "check_loss", "check_scores", "code_origin", "config_loss", "describe",
           "import_function", "input_problem", "is_function_ref", "model_key",
           "nearest", "output_field", "own_batches", "parse_workload", "probe_scores",
           "targets_in_inputs", "token_task"]


# the settings that reach a model that is not a built-in (how it is built, what it is fed, its loss),
# not the batch, precision or device: its pre-run check is made once for them, its FLOPs counted once
MODEL_SETTINGS = ("workload", "framework", "workload_params", "input_shape", "num_classes", "input_kind", "batches",
                  "loss", "loss_output", "seed", "dataset", "data_dir", "held_out")


def model_key(config: Config) -> Config:
    """The config with only its ``MODEL_SETTINGS`` (the others at their defaults)."""
    return Config(**{name: getattr(config, name) for name in MODEL_SETTINGS})


def counted_once(directory: Path | None, config: Config, facts: dict[str, Any], framework_version: str,
                 count: Callable[[], dict[str, Any]], kind: str = "flops") -> dict[str, Any]:
    """A factory's or a zoo's model's FLOP count (``count()``: the backend's), counted by the
    first worker of a run that builds the model and read back by the others from ``directory``
    (the run's; None: counted here). The count is one training step on the host at a fixed
    batch, the same for every config that builds the same model from the same code: every
    setting that reaches the model (not the batch, precision or device), the factory file's
    SHA-1 or the zoo's version and the framework's version make the key, with ``kind``: what
    was counted (``flops``: the training step; ``recomputed``: what activation checkpointing
    recomputes, ``recomputed_flops_per_sample``). Counting costs a
    worker seconds (PyTorch's FlopCounterMode imports its compiler stack, then steps the model
    on the host), which every repeat of every config paid again."""
    if directory is None:
        return count()
    key = {**{name: getattr(config, name) for name in MODEL_SETTINGS},
           "file_sha1": (facts.get("origin") or {}).get("file_sha1"), "zoo_version": facts.get("version"),
           "framework_version": framework_version}
    digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    path = directory / f"{kind}-{digest}.json"
    with contextlib.suppress(OSError, ValueError):
        found = json.loads(path.read_text())
        if isinstance(found, dict) and ("flops_per_sample" if kind == "flops" else f"{kind}_flops_per_sample") in found:
            return found
    found = count()
    with contextlib.suppress(OSError):  # a full disk or a read-only run directory: the next worker counts again
        directory.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(found))
    return found


def recomputed_once(directory: Path | None, config: Config, facts: dict[str, Any], framework_version: str,
                    count: Callable[[], dict[str, Any]]) -> None:
    """``recomputed_flops_per_sample`` into ``facts`` for a config with activation checkpointing:
    ``count()`` (the backend's: what the backward pass computes again), by rank 0 of a launch and
    once a run (counted_once, kind ``recomputed``); nothing for a model whose FLOPs are unknown."""
    if config.checkpointing != "activations" or int(os.environ.get("RANK", "0")) != 0 or \
            facts.get("flops_per_sample") is None:
        return
    found = counted_once(directory, config, facts, framework_version, count, kind="recomputed")
    if found.get("recomputed_flops_per_sample") is not None:
        facts["recomputed_flops_per_sample"] = found["recomputed_flops_per_sample"]
