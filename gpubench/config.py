"""A config: one point of a sweep, frozen and hashable, with its stable id and hash.

Everything a worker needs to train and measure one configuration. Loading, validating and
expanding suites into configs is gpubench.suite's job; this module only describes a config,
so that the backends, the runner and the results can use it without importing the suite.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from gpubench.options import (
    DISTRIBUTED_KINDS,
    OPTIMIZER_KEYS,
    OPTIMIZER_SETTINGS,
    REPLICA_KINDS,
    STAGE_KINDS,
    device_index,
    device_kind,
    parse_parallelism,
)

MAX_BATCH = "max"  # batch_size = "max": the largest batch that fits, searched before the config runs


@dataclass(frozen=True)
class Config:
    """One point of a sweep: everything a worker needs to train and measure."""

    workload: str
    framework: str = "torch"
    device: str = "cpu"
    batch_size: int | str = 64  # or "max": the largest batch that fits, searched before the config runs
    precision: str = "fp32"
    parallelism: str = "single"
    optimizer: str = "adam"
    lr: float = 1e-3
    # the optimizer's settings (options.OPTIMIZER_SETTINGS): None is the optimizer's default
    beta1: float | None = None
    beta2: float | None = None
    eps: float | None = None
    weight_decay: float | None = None
    momentum: float | None = None
    loss: str = "cross_entropy"
    compile: str = "none"
    memory_format: str = "contiguous"
    data: str = "device"
    data_workers: int = 2
    threads: int = 0  # CPU threads the worker trains with; 0 = the framework's own default
    huge_pages: str = "off"  # "transparent": the worker's memory in transparent huge pages
    dataset: str = "synthetic"
    data_dir: str = ""
    checkpointing: str = "none"
    warmup_steps: int = 5
    steps: int = 20
    windows: int = 5
    window_s: float = 0.0  # > 0: a measured window takes only the steps that fit in this many seconds
    timeout_s: float = 600.0
    seed: int = 0
    telemetry_interval_ms: int = 100
    max_batch_start: int = 64  # batch_size = "max": the search starts here (doubling, then bisection)
    max_batch_limit: int = 65536  # ... and tries no batch above this
    pipeline_microbatches: int = 4
    pipeline_schedule: str = "gpipe"
    # nodes of a multi-node run (``run --nnodes``; not a suite key): a distributed config runs
    # its N processes on every node
    nnodes: int = 1
    # a model that is not a built-in workload (a factory, a zoo's): one sample's shape as the
    # model takes it, the classes of the synthetic task (or a language model's vocabulary),
    # and the user's batch function ("module:function"; none: gpubench's synthetic data)
    input_shape: tuple[int, ...] = ()
    num_classes: int = 0
    batches: str = ""
    # a built-in workload's parameters (depth=2), or a factory's keyword arguments (args.width)
    workload_params: tuple[tuple[str, Any], ...] = ()
    # settings named in the id because another point of this config's sweep differs from it in
    # them (set by the suite's expansion: see gpubench.suite.name_differences); not a setting
    id_keys: tuple[str, ...] = ()

    @property
    def accum_steps(self) -> int:
        """Micro-batches per optimizer step (``grad-accum:N``; 1 otherwise)."""
        kind, n = parse_parallelism(self.parallelism)
        return n if kind == "grad-accum" else 1

    def optimizer_settings(self) -> dict[str, float]:
        """Every setting of this config's optimizer, the suite's value where set, else the
        default (``{"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}``)."""
        defaults = OPTIMIZER_SETTINGS.get(self.optimizer, {})
        return {k: float(v) if (v := getattr(self, k)) is not None else d for k, d in defaults.items()}

    @property
    def distributed(self) -> bool:
        """One process per rank, started by a launcher (``ddp:N``, ``pipeline:N``,
        ``multiworker:N``, also N = 1)."""
        return parse_parallelism(self.parallelism)[0] in DISTRIBUTED_KINDS

    @property
    def pipelined(self) -> bool:
        """``pipeline:N``: the model split into N stages, each on its own device."""
        return parse_parallelism(self.parallelism)[0] in STAGE_KINDS

    @property
    def devices(self) -> int:
        """Devices (ranks, replicas or pipeline stages) one optimizer step runs on; a
        distributed config has N on each of ``nnodes`` nodes."""
        kind, n = parse_parallelism(self.parallelism)
        if kind not in REPLICA_KINDS + STAGE_KINDS:
            return 1
        return n * self.nnodes if kind in DISTRIBUTED_KINDS else n

    @property
    def local_cuda_ordinals(self) -> tuple[int, ...]:
        """The CUDA ordinals this config trains on, on each node: ``cuda:K`` -> (K,); a
        multi-device config (``device = cuda``) puts rank, replica or stage r on cuda:r; a
        CPU config uses none."""
        if device_kind(self.device) != "cuda":
            return ()
        kind, n = parse_parallelism(self.parallelism)
        return tuple(range(n)) if kind in REPLICA_KINDS + STAGE_KINDS else (device_index(self.device),)

    @property
    def replicas(self) -> int:
        """Data-parallel replicas, each taking ``batch_size`` samples of every global batch
        (pipeline stages all see the same samples: 1)."""
        return 1 if self.pipelined else self.devices

    @property
    def batch(self) -> int:
        """``batch_size`` as a number: what everything that trains reads (a ``"max"`` config is
        resolved to the batch its search found before it trains)."""
        if not isinstance(self.batch_size, int):
            raise ValueError(f"batch_size = {self.batch_size!r} is resolved to a number before training")
        return self.batch_size

    @property
    def samples_per_step(self) -> int:
        """Global samples per optimizer step (all ranks, all micro-batches); ``batch_size``
        is the batch of one device: the micro-batch of one replica, or with ``pipeline:N``
        the batch every stage processes, in ``pipeline_microbatches`` micro-batches."""
        return self.batch * self.accum_steps * self.replicas

    @property
    def micro_batch_size(self) -> int:
        """Samples of one forward/backward pass on one device."""
        return self.batch // self.pipeline_microbatches if self.pipelined else self.batch

    def topology_unsupported(self) -> str | None:
        """Why this config cannot run in its run's node layout (every framework), or None.
        Every node must reach each distributed config's rendezvous together, so a multi-node
        run skips the single-process configs on every node."""
        if self.nnodes > 1 and not self.distributed:
            kinds = ", ".join(f"{k}:N" for k in DISTRIBUTED_KINDS)
            return (f"a multi-node run (--nnodes {self.nnodes}) runs distributed configs only ({kinds}); "
                    f"run {self.parallelism} configs without --nnodes")
        return None

    @property
    def workload_label(self) -> str:
        """``cnn``, ``mlp_depth2_width512``, ``mymodels.small_convnet_width16``: the workload
        with its parameters (a factory's or zoo's ``:`` written as ``.``)."""
        return self.workload.replace(":", ".") + "".join(f"_{k}{v}" for k, v in self.workload_params)

    @property
    def variant(self) -> str:
        """The settings named after the identity axes, ``key=value`` joined by ``-`` (``""`` when
        none are): each training setting that differs from its built-in default (data_workers
        only in pipeline mode...), then the settings in ``id_keys`` (those that tell this config
        from another point of its sweep)."""
        named = [name for name in _ID_EXTRAS
                 if getattr(self, name) != DEFAULTS[name] and _ID_ONLY_WHEN.get(name, _ALWAYS)(self)]
        named += [name for name in self.id_keys if name not in named]
        return "-".join(f"{name}={_id_value(name, getattr(self, name))}" for name in named)

    @property
    def config_id(self) -> str:
        """Stable, readable id: the identity axes, plus any other training setting that
        differs from its built-in default, plus the settings that tell this config from the
        other points of its sweep (``id_keys``, set by the suite's expansion), so that no two
        points of a sweep share an id."""
        parts = [self.workload_label, self.framework, self.device, f"bs{self.batch_size}", self.precision,
                 self.parallelism.replace(":", "")]  # grad-accum:4 -> grad-accum4 (no ':' in file names)
        return "-".join(parts + ([self.variant] if self.variant else []))

    @property
    def config_hash(self) -> str:
        """Short hash of every setting (``id_keys`` is how the id is written, not a setting),
        so that results of the same settings are one series wherever they ran."""
        d = self.to_dict()
        del d["id_keys"]
        for name in _HASHED_WHEN_SET:  # settings added later: a config without them keeps its hash
            if d[name] == _HASH_DEFAULTS[name]:
                del d[name]
        blob = json.dumps(d, sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:12]

    def normalised(self) -> Config:
        """This config with every setting it does not use at its default (data_workers outside
        pipeline mode, the pipeline settings outside ``pipeline:N``, the batch search's bounds
        without ``batch_size = "max"``, data_dir without MNIST), so that a sweep over a setting
        where it does nothing makes one point, not several that train alike."""
        unused: dict[str, Any] = {name: DEFAULTS[name] for name, used in _USED_ONLY_WHEN.items() if not used(self)}
        return replace(self, **unused) if unused else self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["workload_params"] = dict(self.workload_params)
        d["id_keys"] = list(self.id_keys)
        d["input_shape"] = list(self.input_shape)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Config:
        d = dict(d)
        d["workload_params"] = tuple(sorted(d.get("workload_params", {}).items()))
        d["id_keys"] = tuple(d.get("id_keys") or ())
        d["input_shape"] = tuple(d.get("input_shape") or ())
        names = {f.name for f in fields(Config)}
        return Config(**{k: v for k, v in d.items() if k in names})


DEFAULTS = {f.name: f.default for f in fields(Config)}
# settings hashed only where set (added after results were recorded under hashes without them)
_HASHED_WHEN_SET = ("input_shape", "num_classes", "batches", *OPTIMIZER_KEYS)
_HASH_DEFAULTS: dict[str, Any] = {"input_shape": [], "num_classes": 0, "batches": "", **dict.fromkeys(OPTIMIZER_KEYS)}
# training settings named in config_id when they differ from their default (some only where
# they matter: _ID_ONLY_WHEN); the others (measurement settings, data_dir) are named only where
# a sweep varies them (id_keys)
_ID_EXTRAS = ("optimizer", "lr", *OPTIMIZER_KEYS, "loss", "compile", "memory_format", "data", "data_workers",
              "threads", "huge_pages", "dataset", "checkpointing", "pipeline_microbatches", "pipeline_schedule",
              "nnodes", "seed", "batches")
# every setting outside the identity axes and the workload's parameters: what id_keys may name
ID_AXES = ("workload", "framework", "device", "batch_size", "precision", "parallelism")
NAMEABLE = tuple(f.name for f in fields(Config) if f.name not in (*ID_AXES, "workload_params", "id_keys"))
def _ALWAYS(c: Config) -> bool:
    return True


def _takes(setting: str) -> Callable[[Config], bool]:
    """Whether a config's optimizer takes ``setting``."""
    return lambda c: setting in OPTIMIZER_SETTINGS.get(c.optimizer, {})


_ID_ONLY_WHEN: dict[str, Callable[[Config], bool]] = {
    "data_workers": lambda c: c.data == "pipeline",
    "pipeline_microbatches": lambda c: c.pipelined,
    "pipeline_schedule": lambda c: c.pipelined,
}
# settings a config uses only where this holds (Config.normalised sets them to their default
# elsewhere)
_USED_ONLY_WHEN: dict[str, Callable[[Config], bool]] = {
    **_ID_ONLY_WHEN,
    "max_batch_start": lambda c: c.batch_size == MAX_BATCH,
    "max_batch_limit": lambda c: c.batch_size == MAX_BATCH,
    "data_dir": lambda c: c.dataset == "mnist",
    # a built-in workload declares its input and classes, and trains on gpubench's data
    "input_shape": lambda c: ":" in c.workload,
    "num_classes": lambda c: ":" in c.workload,
    "batches": lambda c: ":" in c.workload,
    # an optimizer's settings, only with an optimizer that takes them
    **{k: _takes(k) for k in OPTIMIZER_KEYS},
}


def _id_value(name: str, value: Any) -> str:
    """A setting's value as the id writes it: a path as its last part and a short hash of the
    whole (readable, and two directories with the same last part stay apart)."""
    if name == "input_shape":
        return "x".join(map(str, value))
    if name in ("batches", "loss"):
        return str(value).replace(":", ".")
    if name == "data_dir":
        digest = hashlib.sha1(str(value).encode()).hexdigest()[:6]
        return f"{Path(str(value)).name or 'none'}.{digest}"
    return str(value)
