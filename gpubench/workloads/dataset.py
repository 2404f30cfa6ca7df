"""A data set of samples: MNIST's files, or the user's (``dataset = "module:function"``,
``held_out = "module:function"``) in the forms users have; its training split streamed epoch
after epoch, its held-out split evaluated whole.

Each of the user's functions is called once a process, with no arguments, and returns one split
in any of these forms: a PyTorch ``Dataset`` (map-style, ``TensorDataset``, or iterable: samples)
or ``DataLoader`` (its batches), a ``tf.data.Dataset`` (samples, or batches where it was
batched), a pair of arrays ``(inputs, targets)`` (NumPy, or a framework's tensors), or any other
iterable of ``(inputs, targets)`` batches; a sample, batch or pair may be a mapping of the inputs
and their ``label`` (a Hugging Face ``datasets`` row or column). Every form becomes the same two
NumPy arrays (inputs float32, or int64 token ids where they are signed integers: uint8 pixels
are floats; targets int64 class labels), so every framework trains on the same samples
whichever form it was handed; a form needs only its own library where it is read.

The training stream is made of epochs: each a permutation of the training split drawn from the
config's seed, trial and epoch, cut into steps of ``batch_size`` x the step's micro-batches (or
replicas); with ``drop_last`` an epoch's last partial step is dropped, without it the next
epoch's first samples complete it (the stream of tf.data's ``repeat().batch()``: no sample
dropped). The pool holds the steps the config trains (a target's ``max_steps``, else its warm-up
and windows), within the pool's budget; past the pool the stream starts again at its first
epoch, and the result's ``runtime.dataset`` says what the pool holds. The held-out evaluation
covers the whole held-out split, or ``eval_samples`` of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from gpubench.config import Config
from gpubench.workloads.base import WorkloadSpec
from gpubench.workloads.data import DATA_BYTES_BUDGET, Batches, to_numpy
from gpubench.workloads.functions import SourceError, import_function

FORMS = ("a PyTorch Dataset or DataLoader, a tf.data.Dataset, a pair of arrays (inputs, targets), or an iterable of "
         "(inputs, targets) batches (each pair possibly a mapping of the inputs and their label)")
SHUFFLE_STREAM = 4  # the seed stream of the epochs' orders (1-3: the synthetic tasks)
EVAL_BATCH_MAX = 256  # a held-out batch: the largest divisor of the split up to this (or the config's batch)


class DataError(ValueError):
    """A split that cannot be used: one line naming the key and what was found."""


@dataclass(frozen=True)
class Split:
    """One split as two arrays (``x`` (N, *input_shape), ``y`` (N,) int64) and the form it came
    in; ``truncated``: an endless iterable read up to the pool's budget."""

    x: np.ndarray
    y: np.ndarray
    form: str
    truncated: bool = False

    @property
    def samples(self) -> int:
        return len(self.y)

    @property
    def classes(self) -> int:
        return int(self.y.max()) + 1

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x.shape[1:])


def user_dataset(config: Config) -> bool:
    """Whether the config trains on the user's data set (``dataset = "module:function"``)."""
    return ":" in config.dataset


def _is_array(a: Any) -> bool:
    return hasattr(a, "shape") and hasattr(a, "dtype") and len(getattr(a, "shape", ())) >= 1


LABEL_KEYS = ("label", "labels", "target", "targets", "y")  # a mapping's targets (a Hugging Face row's "label")


def _pair(item: Any, key: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of a sample or batch: a pair, or a mapping of two (a Hugging Face
    ``datasets`` row or batch: its inputs and its ``label``)."""
    if isinstance(item, Mapping) and len(item) == 2 and (labels := [k for k in item if k in LABEL_KEYS]):
        (inputs,) = [k for k in item if k != labels[0]]
        return to_numpy(item[inputs]), to_numpy(item[labels[0]])
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise DataError(f"{key}: {what} is {_described(item)}; expected (inputs, targets), or a mapping of the "
                        f"inputs and one of {', '.join(LABEL_KEYS)}")
    return to_numpy(item[0]), to_numpy(item[1])


def _described(obj: Any) -> str:
    shape = getattr(obj, "shape", None)
    return f"a {type(obj).__name__}" + (f" of shape {list(shape)}" if shape is not None else "")


def _module(obj: Any) -> str:
    return type(obj).__module__ or ""


def _read(items: Iterable[Any], key: str, limit_bytes: float) -> tuple[np.ndarray, np.ndarray, bool]:
    """The (inputs, targets) of an iterable as two arrays: its items samples (a target a scalar:
    stacked) or batches (targets a vector: joined), read until it ends or ``limit_bytes`` (an
    endless stream: truncated, the third value)."""
    xs, ys, size, truncated, batched = [], [], 0, False, None
    for item in items:
        x, y = _pair(item, key, "an item")
        if batched is None:
            batched = y.ndim >= 1
        elif batched != (y.ndim >= 1):
            raise DataError(f"{key}: its items mix samples and batches (targets of shape {list(y.shape)})")
        xs.append(x)
        ys.append(y)
        size += x.nbytes + y.nbytes
        if size >= limit_bytes:
            truncated = True
            break
    if not xs:
        return np.zeros((0,), np.float32), np.zeros((0,), np.int64), False
    try:
        joined = (np.concatenate(xs), np.concatenate(ys)) if batched else (np.stack(xs), np.stack(ys))
    except ValueError as e:
        raise DataError(f"{key}: its {'batches' if batched else 'samples'} do not stack into one array: {e}") from None
    return joined[0], joined[1], truncated


def to_split(obj: Any, key: str, limit_bytes: float = 4 * DATA_BYTES_BUDGET) -> Split:
    """Any of the forms (the module docstring) as a Split; DataError for anything else. The forms
    are told apart by what they do, so that no framework is named here: a ``tensors`` pair (a
    TensorDataset, read whole), a pair or mapping of two arrays, ``as_numpy_iterator`` (a
    tf.data.Dataset), ``__getitem__`` and ``__len__`` (a map-style Dataset), any other iterable
    (a DataLoader, an IterableDataset, a generator, a list of batches); each item a sample or a
    batch by its targets' shape (one class label a sample)."""
    form = type(obj).__name__.lstrip("_")
    tensors = getattr(obj, "tensors", None)
    if isinstance(tensors, (tuple, list)) and len(tensors) == 2 and all(_is_array(t) for t in tensors):
        x, y, truncated = to_numpy(tensors[0]), to_numpy(tensors[1]), False
    elif isinstance(obj, (tuple, list, Mapping)) and len(obj) == 2 and all(
            _is_array(a) for a in (obj.values() if isinstance(obj, Mapping) else obj)):
        (x, y), truncated, form = _pair(obj, key, "it"), False, "arrays"
    elif callable(getattr(obj, "as_numpy_iterator", None)):
        x, y, truncated = _read(obj.as_numpy_iterator(), key, limit_bytes)
    elif hasattr(obj, "__getitem__") and hasattr(obj, "__len__") and not isinstance(obj, (tuple, list, Mapping, str)) \
            and not _is_array(obj):
        x, y, truncated = _read((obj[i] for i in range(len(obj))), key, math.inf)
    elif isinstance(obj, Iterable) and not isinstance(obj, (str, bytes, Mapping)) and not _is_array(obj):
        x, y, truncated = _read(obj, key, limit_bytes)
        form = "batches" if isinstance(obj, (list, tuple)) or form == "generator" else form
    else:
        raise DataError(f"{key}: returned {_described(obj)}; expected {FORMS}")
    return _checked(x, y, key, form, truncated)


def _checked(x: np.ndarray, y: np.ndarray, key: str, form: str, truncated: bool) -> Split:
    if len(y) == 0:
        raise DataError(f"{key}: the split is empty ({form} of no samples)")
    if x.ndim < 2 or len(x) != len(y):
        raise DataError(f"{key}: inputs of shape {list(x.shape)} and targets of shape {list(y.shape)}; expected "
                        "one input and one class label a sample, the samples first")
    if y.ndim != 1 or y.dtype.kind not in "iub":
        raise DataError(f"{key}: targets of shape {list(y.shape)} and type {y.dtype}; expected one integer class "
                        "label a sample")
    if y.min() < 0:
        raise DataError(f"{key}: a class label {int(y.min())}; labels are 0, 1, ... (the classes' indices)")
    x = np.ascontiguousarray(x, dtype=np.int64 if x.dtype.kind == "i" else np.float32)  # token ids, or values
    return Split(x, np.ascontiguousarray(y, dtype=np.int64), form, truncated)


def call_split(ref: str, key: str) -> Split:
    """The split the user's function ``ref`` returns (called with no arguments)."""
    fn = import_function(ref, key)
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the user's function failed: say how
        raise SourceError(f"{key} {ref!r}: calling it failed: {type(e).__name__}: {e}") from None
    try:
        return to_split(out, f"{key} {ref!r}")
    except DataError as e:
        raise SourceError(str(e)) from None


@lru_cache(maxsize=4)
def load_splits(dataset: str, held_out: str, num_classes: int = 0) -> tuple[Split, Split | None]:
    """The training split and the held-out split (None without ``held_out``), checked against
    each other and against ``num_classes`` (the suite's, 0: the data's own); once a process."""
    train = call_split(dataset, "dataset")
    held = call_split(held_out, "held_out") if held_out else None
    classes = num_classes or train.classes
    if train.classes > classes:
        raise SourceError(f"dataset {dataset!r}: a class label {train.classes - 1}, outside num_classes = {classes}")
    if held is not None:
        if held.input_shape != train.input_shape or held.x.dtype != train.x.dtype:
            raise SourceError(f"held_out {held_out!r}: samples of shape {list(held.input_shape)} ({held.x.dtype}) "
                              f"where the training split's are {list(train.input_shape)} ({train.x.dtype})")
        if held.classes > classes:
            raise SourceError(f"held_out {held_out!r}: a class label {held.classes - 1}, outside the "
                              f"{classes} classes of " + ("num_classes" if num_classes else "the training split"))
    return train, held


@lru_cache(maxsize=2)
def mnist_splits(data_dir: str) -> tuple[Split, Split | None]:
    """MNIST's training files and, where they are there, its t10k files (the held-out split)."""
    from gpubench.workloads.mnist import has_test_split, load_mnist

    held = Split(*load_mnist(data_dir, test=True), form="MNIST t10k files") if has_test_split(data_dir) else None
    return Split(*load_mnist(data_dir), form="MNIST files"), held


def splits(config: Config) -> tuple[Split, Split | None]:
    """The config's data set, a source of two splits: MNIST's files, or the user's functions."""
    if config.dataset == "mnist":
        return mnist_splits(config.data_dir)
    return load_splits(config.dataset, config.held_out, config.num_classes)


def builtin_spec(config: Config) -> WorkloadSpec:
    """A built-in workload's spec for the config: on the user's data set, for its samples' shape
    and classes (the suite's ``input_shape`` and ``num_classes`` where it says them)."""
    from gpubench.workloads import get_workload

    spec = get_workload(config.workload).spec(**dict(config.workload_params))
    if not user_dataset(config):
        return spec
    train, _ = splits(config)
    try:
        return spec.for_task(config.input_shape or train.input_shape, config.num_classes or train.classes)
    except ValueError as e:
        raise SourceError(f"dataset {config.dataset!r}: {e}") from None


def steps_trained(config: Config) -> int:
    """Optimizer steps a config takes at most: a target's ``max_steps`` (and its first step), else
    the cold start, the warm-up and every window's steps."""
    if config.target_loss > 0:
        return config.max_steps + 1
    return 1 + config.warmup_steps + config.windows * config.steps


def epoch_order(samples: int, seed: int, trial: int, epoch: int) -> np.ndarray:
    """Epoch ``epoch``'s order of the training split: a permutation drawn from the seed, the
    trial (a target's repeat: its own orders) and the epoch."""
    return np.random.default_rng([seed, SHUFFLE_STREAM, trial, epoch]).permutation(samples)


def stream_batches(split: Split, batch: int, group: int, config: Config, facts: dict[str, Any]) -> Batches:
    """The training stream's pool: epochs of the split, each in its own order, in batches of
    ``batch``, a whole number of ``group`` (the micro-batches, or replicas, of one step) and as
    many as the config trains, within DATA_BYTES_BUDGET (at least one step's); ``facts`` (the
    result's ``runtime.dataset``) gets what the pool holds."""
    n, step = split.samples, batch * group
    if n < step:
        raise DataError(f"dataset {config.dataset!r}: {n} samples, fewer than one step's {step} ({group} x {batch})")
    sample_bytes = split.x[0].nbytes + split.y[0].nbytes
    # whole steps: a step's micro-batches (or replicas' batches) are one batch of batch x group, cut
    steps = max(1, min(DATA_BYTES_BUDGET // (sample_bytes * step), steps_trained(config)))
    used = n // step * step if config.drop_last else n  # samples of an epoch the stream takes
    epochs = [epoch_order(n, config.seed, config.trial, e)[:used] for e in range(math.ceil(steps * step / used))]
    index = np.concatenate(epochs)[: steps * step]
    wanted = steps * group
    facts.update(source=f"dataset {config.dataset}" if user_dataset(config) else config.dataset, form=split.form,
                 train_samples=n, input_shape=list(split.input_shape), classes=split.classes,
                 drop_last=config.drop_last, samples_per_epoch=used, pool_batches=wanted,
                 pool_epochs=round(wanted * batch / used, 3))
    if split.truncated:
        facts["truncated"] = f"an endless stream: its first {n} samples (the pool's budget)"
    if steps < steps_trained(config):
        facts["pool_note"] = (f"the pool holds {steps} steps ({DATA_BYTES_BUDGET >> 20} MiB); the config trains up "
                              f"to {steps_trained(config)}: past the pool the stream starts again")
    return Batches(x=split.x[index].reshape(wanted, batch, *split.input_shape), y=split.y[index].reshape(wanted, batch))


def held_out_batches(split: Split, batch: int, eval_samples: int, facts: dict[str, Any]) -> Batches:
    """The held-out split (its first ``eval_samples``; 0: all of it) in equal batches, so that
    the mean of the batches' mean losses is the mean over every sample: a batch the largest
    divisor of the samples up to max(``batch``, EVAL_BATCH_MAX), or where that is under half
    the config's batch (a prime count), batches of ``batch`` and the remainder left out, said."""
    n = min(split.samples, eval_samples) if eval_samples else split.samples
    cap = min(n, max(batch, EVAL_BATCH_MAX))
    size = next(d for d in range(cap, 0, -1) if n % d == 0)
    if size < min(batch, n) / 2:
        size = min(batch, n)
    used = n // size * size
    facts.update(held_out_samples=split.samples, evaluated_samples=used, eval_batch=size)
    return Batches(x=split.x[:used].reshape(used // size, size, *split.input_shape),
                   y=split.y[:used].reshape(used // size, size))


def split_pool(config: Config, facts: dict[str, Any]
               ) -> tuple[Callable[[int, int], Batches], Callable[[int], Batches] | None]:
    """(``make_batches(batch, group)``, ``held_out(batch)`` or None where the data set has no
    held-out split) of a config on a data set (``mnist``, the user's), read when first called;
    ``facts`` is filled as they are made."""
    from gpubench.workloads.mnist import has_test_split

    def make(batch: int, group: int) -> Batches:
        return stream_batches(splits(config)[0], batch, group, config, facts)

    def held_out(batch: int) -> Batches:
        held = splits(config)[1]
        assert held is not None  # (a data set with a held-out split)
        return held_out_batches(held, batch, config.eval_samples, facts)

    has_held = bool(config.held_out) if user_dataset(config) else has_test_split(config.data_dir)
    return make, held_out if has_held else None
