"""The vocabulary of a config's settings, and what a backend declares it supports.

A leaf module: it imports nothing from gpubench, so the suite, the backends, the runner and
the telemetry can all share it without import cycles. The built-in values are listed here;
a backend declares the subset it supports in a ``Capabilities`` value, and the suite accepts
any value some registered backend declares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

PRECISIONS = ("fp32", "tf32", "amp-fp16", "amp-bf16")
# parallel strategies: "single", or "<kind>:N" for the kinds below (N >= 1)
PARALLEL_KINDS = ("grad-accum", "ddp", "dp", "fsdp", "tp", "mirrored", "pipeline", "multiworker")
# two kinds on the two axes of a 2-D mesh of A x B ranks, "fsdp:A+tp:B" (torchtitan's 2-D): tensor
# parallel within each group of B consecutive ranks (one node's), fully sharded data parallel across
# the A groups (A x nnodes of them on several nodes); its N is A x B, the ranks of one node
COMPOSITE_KINDS = {"fsdp+tp": ("fsdp", "tp")}
# one process per rank, started as the backend declares (RankStart); N processes per node,
# N x nnodes in all
DISTRIBUTED_KINDS = ("ddp", "fsdp", "tp", "fsdp+tp", "pipeline", "multiworker")
# data parallel: N devices, batch_size samples on each (fsdp: each holds a shard of the state;
# fsdp+tp: each group of B tensor-parallel ranks is one replica)
REPLICA_KINDS = ("ddp", "dp", "fsdp", "fsdp+tp", "mirrored", "multiworker")
STAGE_KINDS = ("pipeline",)  # model parallel: N devices, each runs its stage on every sample
# model parallel within each layer: N devices, each holds a slice of every split layer and sees
# every sample of its replica
TENSOR_KINDS = ("tp", "fsdp+tp")
# each device holds only part of the model's state (parameters, gradients, optimizer state), so the
# replicas' weights are not compared: their shards differ by design
SHARDED_KINDS = ("fsdp", "tp", "fsdp+tp", "pipeline")
# what a mesh framework (MESH_FRAMEWORKS) runs in one process over the node's devices
MESH_SHARDED_KINDS = ("fsdp", "tp", "fsdp+tp")
# frameworks that run fsdp:N and tp:N in one process over a mesh of the node's N devices (jax.jit
# with sharded arrays) rather than as N processes: filled where the backends are registered
# (gpubench.backends.registry, register_backend(..., mesh=True)), which every command imports
# before it reads a config (a program of its own imports gpubench.backends first)
MESH_FRAMEWORKS: set[str] = set()
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
# fsdp:N: when a block's gathered parameters are freed (FSDP2's reshard_after_forward True / False)
FSDP_RESHARDS = ("after-forward", "after-backward")
OPTIMIZERS = ("adam", "adamw", "sgd")
# each optimizer's settings with their defaults (PyTorch's; every backend builds the same
# optimizer from them): a suite may set any of them (`beta2 = 0.95`), and a config whose
# optimizer does not take one keeps it unset. Adam's epsilon is added after the bias
# correction (PyTorch, Optax; Keras adds it before: tests/test_identity.py); AdamW decays the
# weights by lr x weight_decay, decoupled from the gradient; SGD's momentum has no dampening.
OPTIMIZER_SETTINGS: dict[str, dict[str, float]] = {
    "adam": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
    "adamw": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01},
    "sgd": {"momentum": 0.9},
}
LOSSES = ("cross_entropy",)
# what a model that is not a built-in trains on, without a batch function: auto (tokens where its
# first layer is an embedding), features (float arrays, a class per sample), tokens (next-token task)
INPUT_KINDS = ("auto", "features", "tokens")
# the value a backend declares for a setting that also takes the user's function ("module:function":
# a loss), where it calls that function (a loss of your own: every built-in backend)
USER_FUNCTION = "module:function"
# none: eager PyTorch / a TensorFlow graph tf.function; xla: TensorFlow jit_compile; the
# torch-compile values: torch.compile with that mode; cuda-graph: the whole PyTorch step
# captured as one CUDA graph
COMPILES = ("none", "xla", "torch-compile", "torch-compile-reduce-overhead", "torch-compile-max-autotune",
            "cuda-graph", "best")
# compile = "best": each framework's strongest stated mode (Capabilities.best_compile), the mode
# for comparing frameworks on equal effort; a suite's "best" becomes that mode as the suite expands
BEST_COMPILE = "best"
MEMORY_FORMATS = ("contiguous", "channels-last")
DATA_MODES = ("device", "pipeline")
DATASETS = ("synthetic", "mnist")
CHECKPOINTINGS = ("none", "activations")  # activations: recomputed in the backward pass
# how a transformer computes attention: `math` (its two matrix products and a softmax), `sdpa`
# (the framework's own attention, its choice of kernel), `flash`, `efficient` (PyTorch's
# memory-efficient kernel), `cudnn`; each backend declares those it offers
ATTENTIONS = ("math", "sdpa", "flash", "efficient", "cudnn")
# how the optimizer's update runs: auto (gpubench's choice: PyTorch's fused kernels on CUDA, the
# framework's default elsewhere), a loop over the parameters, one foreach kernel per operation
# across them, or one fused kernel
OPTIMIZER_IMPLS = ("auto", "for-loop", "foreach", "fused")
# the workloads that compute attention: the built-in transformers, and a plugin's that says so
# (gpubench.workloads.register_workload; a test holds the built-in ones to the registry)
ATTENTION_WORKLOADS: set[str] = {"gpt", "vit"}


# the largest N of "<kind>:N": devices or processes on one node (the largest machines have 8-16
# GPUs, and a CPU run one process per core), and micro-batches per step; beyond these the
# launcher would start more processes than any machine holds, or a step would never end
MAX_DEVICES = 256
MAX_MICROBATCHES = 65536


def max_parallel(kind: str) -> int:
    return MAX_MICROBATCHES if kind == "grad-accum" else MAX_DEVICES


def parallel_form(kind: str) -> str:
    """How a parallel kind is written: ``single``, ``ddp:N``, ``fsdp:A+tp:B``."""
    if kind in COMPOSITE_KINDS:
        return "+".join(f"{axis}:{size}" for axis, size in zip(COMPOSITE_KINDS[kind], "AB", strict=True))
    return kind if kind == "single" else f"{kind}:N"


# every form a parallelism takes (the N, A and B are numbers >= 1)
PARALLELISMS = tuple(parallel_form(k) for k in ("single", *PARALLEL_KINDS, *COMPOSITE_KINDS))


@dataclass(frozen=True)
class Parallelism:
    """A parallelism setting parsed (once a config: ``Config.parallel``). ``kind``: ``single``,
    a kind of PARALLEL_KINDS, or ``fsdp+tp``; ``n``: the devices (ranks, replicas, stages) of one
    node, or grad-accum's micro-batches (``fsdp:2+tp:4``: 8); ``axes``: each kind with its size
    (``(("fsdp", 2), ("tp", 4))``; ``(("ddp", 4),)``; ``(("single", 1),)``)."""

    kind: str
    n: int
    axes: tuple[tuple[str, int], ...]

    def size(self, axis: str) -> int:
        """The size of one axis (``tp``, ``fsdp``, ...), 0 where the setting has none."""
        return dict(self.axes).get(axis, 0)


def parse_parallelism(value: object) -> Parallelism:
    """``"single"``, ``"grad-accum:4"``, ``"fsdp:2+tp:4"`` as a Parallelism. Raises ValueError
    naming the allowed forms and bounds."""
    parts = value.split("+") if isinstance(value, str) else [value]
    axes = tuple(_one_kind(value, part) for part in parts)
    kinds = tuple(k for k, _ in axes)
    if len(axes) == 1:
        return Parallelism(axes[0][0], axes[0][1], axes)
    if kinds not in COMPOSITE_KINDS.values():
        raise ValueError(f"parallelism {value!r}: kinds combine only as "
                         f"{', '.join(parallel_form(k) for k in COMPOSITE_KINDS)}")
    if (total := axes[0][1] * axes[1][1]) > MAX_DEVICES:
        raise ValueError(f"parallelism {value!r}: A x B = {total} ranks on a node; at most {MAX_DEVICES}")
    return Parallelism("+".join(kinds), total, axes)


def _one_kind(value: object, part: object) -> tuple[str, int]:
    kind, sep, n = part.partition(":") if isinstance(part, str) else ("", "", "")
    if part == "single" and value == "single":
        return "single", 1
    if kind in PARALLEL_KINDS and sep and n.isascii() and n.isdigit() and int(n) >= 1:
        if int(n) > max_parallel(kind):
            raise ValueError(f"parallelism {value!r}: N must be 1..{max_parallel(kind)} for {kind}")
        return kind, int(n)
    raise ValueError(f"unknown parallelism {value!r}; expected one of: {', '.join(PARALLELISMS)} (N >= 1; at most "
                     f"{MAX_DEVICES} devices or processes, {MAX_MICROBATCHES} grad-accum micro-batches)")


def device_kind(device: str) -> str:
    """'cpu' or 'cuda' for a normalised device name such as 'cuda:1'."""
    return device.split(":", 1)[0]


def device_index(device: str) -> int:
    return int(device.split(":", 1)[1]) if ":" in device else 0


class Settings(Protocol):
    """What a capability check reads of a config (a Config): its device, whether it uses a
    setting, and the checked settings by name."""

    @property
    def device(self) -> str: ...
    @property
    def parallel(self) -> Parallelism: ...
    def uses(self, name: str) -> bool: ...


@dataclass(frozen=True)
class RankStart:
    """How the processes of a distributed parallel kind start, as the backend that runs the kind
    declares it (``Capabilities.rank_start``). ``node_module``: a launcher run with
    ``python -m`` once per node that starts the node's ranks itself and takes torchrun's flags
    (``--nproc-per-node``; one node: ``--standalone --nnodes=1``; across nodes the static
    rendezvous ``--nnodes --node-rank --master-addr --master-port``, or under Slurm the c10d one,
    ``--rdzv-backend --rdzv-id --rdzv-endpoint``), then ``-m gpubench.runner.worker WORKDIR``.
    None: every rank is a process of its own that gpubench starts (on a node,
    gpubench.runner.ranks, with the rank variables and every rank's address; under Slurm, one
    srun task per rank, with ``slurm_env`` exported, where ``$port`` is the job's first port).
    Under Slurm such a rank gets its rank variables (numbered node by node, the nodes by host name
    sorted as text) but no ``GPUBENCH_WORKERS``: its backend makes its cluster from Slurm's
    variables (``slurm_env`` says how)."""

    node_module: str | None = None
    slurm_env: tuple[str, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    """What a framework's backend can run: the values of each setting it supports (precisions
    per device kind, parallel strategies by kind). A config asking for anything else ends
    ``unsupported`` with a reason naming what is supported, before any process starts, so no
    setting is ever silently ignored. ``notes`` explain a value the backend leaves out (key:
    ``"setting=value"``), and are appended to that reason."""

    precisions: Mapping[str, tuple[str, ...]]  # device kind -> precisions
    parallelism: tuple[str, ...]  # "single" and the kinds of "<kind>:N" (and "fsdp+tp") it runs
    compile: tuple[str, ...] = ("none",)
    memory_format: tuple[str, ...] = ("contiguous",)
    data: tuple[str, ...] = ("device",)
    dataset: tuple[str, ...] = (*DATASETS, USER_FUNCTION)
    checkpointing: tuple[str, ...] = ("none",)
    optimizer: tuple[str, ...] = OPTIMIZERS
    loss: tuple[str, ...] = (*LOSSES, USER_FUNCTION)
    notes: Mapping[str, str] = field(default_factory=dict)
    # a setting declared later, whose values the backends declare (gpubench.config.setting with a
    # "declared" check), by name: the values this backend supports (none listed: none)
    others: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # how the ranks of each distributed kind it runs start (a kind left out: every rank a
    # process of its own, started by gpubench: RankStart())
    rank_start: Mapping[str, RankStart] = field(default_factory=dict)
    # compile = "best": by device kind, its compile modes from the strongest down; a config
    # takes the first one its rules allow (none listed, or none allowed: "none")
    best_compile: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def values(self, setting: str) -> tuple[str, ...]:
        """Every value of ``setting`` this backend supports on some device."""
        if setting == "precision":
            return tuple(dict.fromkeys(p for ps in self.precisions.values() for p in ps))
        if setting == "compile":  # every backend takes "best": the suite makes it one of its own modes
            return (*self.compile, BEST_COMPILE)
        if setting in self.others or not hasattr(self, setting):
            return tuple(self.others.get(setting, ()))
        values: tuple[str, ...] = getattr(self, setting)
        return values

    def problem(self, framework: str, config: Settings, checked: Sequence[str],
                functions: Sequence[str] = ()) -> str | None:
        """Why ``framework`` cannot run ``config`` by these declarations, or None. ``checked``: the
        settings whose values a backend declares, in the order problems are reported
        (``gpubench.config.BACKEND_CHECKED``, derived from the settings' declarations);
        ``functions``: those of them that also take the user's function, asked as
        ``USER_FUNCTION`` (``gpubench.config.FUNCTION_CHECKED``)."""
        kind = device_kind(config.device)
        for setting in checked:
            if not config.uses(setting):  # a setting the config does not use is not asked (a cnn's attention)
                continue
            value = getattr(config, setting)
            if setting in functions and ":" in str(value):  # the user's "module:function"
                value = USER_FUNCTION
            if setting == "parallelism":
                value = config.parallel.kind
                allowed = self.parallelism
            elif setting == "precision":
                allowed = self.precisions.get(kind, ())
            else:
                allowed = self.values(setting)
            if value in allowed:
                continue
            where = f" on {kind}" if setting == "precision" else ""
            shown = [parallel_form(a) if setting == "parallelism" else a for a in allowed]
            note = self.notes.get(f"{setting}={value}")
            return (f"{framework} does not support {setting} = {getattr(config, setting)}{where}; it supports: "
                    f"{', '.join(shown) or 'none'}" + (f" ({note})" if note else ""))
        return None
