"""A config: one point of a sweep, frozen and hashable, with its stable id and hash.

Everything a worker needs to train and measure one configuration. Loading, validating and
expanding suites into configs is gpubench.suite's job; this module only describes a config,
so that the backends, the runner and the results can use it without importing the suite.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from gpubench.hugepages import HUGE_PAGES
from gpubench.options import (
    ATTENTION_WORKLOADS,
    ATTENTIONS,
    CHECKPOINTINGS,
    COMPILES,
    DATA_MODES,
    DATASETS,
    DISTRIBUTED_KINDS,
    FSDP_RESHARDS,
    INPUT_KINDS,
    LOSSES,
    MAX_DEVICES,
    MAX_MICROBATCHES,
    MEMORY_FORMATS,
    MESH_FRAMEWORKS,
    MESH_SHARDED_KINDS,
    OPTIMIZER_IMPLS,
    OPTIMIZER_SETTINGS,
    OPTIMIZERS,
    PIPELINE_SCHEDULES,
    PRECISIONS,
    REPLICA_KINDS,
    STAGE_KINDS,
    TENSOR_KINDS,
    Parallelism,
    device_index,
    device_kind,
    parallel_form,
    parse_parallelism,
)

MAX_BATCH = "max"  # batch_size = "max": the largest batch that fits, searched before the config runs
SEED_MAX = 2**32 - 1  # the widest seed every generator takes (numpy's legacy seeding)
TRIAL_SEED_STRIDE = 1_000_003  # trial r's weights: seed + r x this (a prime: no two trials of nearby seeds meet)
NAMED = ("axis", "changed", "swept")


def setting(default: Any = MISSING, *, check: tuple[Any, ...] | None, help: str, named: str = "swept",
            used_when: Callable[[Any], bool] | None = None, named_when_used: bool = False,
            hashed_when_set: bool = False, column: bool = False) -> Any:
    """A suite key, declared once, as a field of Config: its default; ``check``, how a suite's
    value is checked (gpubench.settings: ``("int", 1)``, ``("declared", kind, built-in
    values)`` for a setting whose values each backend declares it supports, ...; None: not a
    suite key); ``help`` (the Suite keys reference); ``named``, when the setting is in the
    config id: ``axis`` (always, an identity axis), ``changed`` (where it differs from its
    default, and with ``named_when_used`` only where the config uses it), ``swept`` (only where
    another point of the sweep differs in it); ``used_when``: the configs that use it (elsewhere
    it is reset to its default, so a sweep over it makes one point); ``hashed_when_set``: part
    of the config hash only where set (a setting added after results were recorded: their
    hashes stay); ``column``: a column of the results frame and ``results.csv`` (the identity
    axes are)."""
    if named not in NAMED:
        raise ValueError(f"named={named!r}: expected one of {NAMED}")
    meta = {"setting": True, "check": check, "help": help, "named": named, "used_when": used_when,
            "named_when_used": named_when_used, "hashed_when_set": hashed_when_set,
            "column": column or named == "axis"}
    return field(metadata=meta) if default is MISSING else field(default=default, metadata=meta)


def _takes(name: str) -> Callable[[Any], bool]:
    """Whether a config's optimizer takes the setting ``name``."""
    return lambda c: name in OPTIMIZER_SETTINGS.get(c.optimizer, {})


def _user_dataset(c: Any) -> bool:
    """A config on the user's data set (``dataset = "module:function"``)."""
    return ":" in c.dataset


def _real_data(c: Any) -> bool:
    """A config on a data set of samples (``mnist``, the user's), streamed by epochs."""
    return c.dataset != "synthetic"


def _own_model(c: Any) -> bool:
    """A model that is not a built-in workload (a factory, a zoo's): a built-in declares its
    input and classes and trains on gpubench's data."""
    return ":" in c.workload


def _own_model_or_data(c: Any) -> bool:
    """A model that is not a built-in, or a built-in on the user's data set (its input and classes
    the data's, or the suite's)."""
    return _own_model(c) or _user_dataset(c)


@dataclass(frozen=True)
class Config:
    """One point of a sweep: everything a worker needs to train and measure."""

    workload: str = setting(
        check=("workload",), named="axis",
        help=("the model: a built-in workload (`cnn`, `mlp`, `resnet18`, `resnet50`, `gpt`, `vit`, and plugins' "
              'workloads: `gpubench list` names them), your factory `"module:function"` returning a model of the '
              'config\'s framework (a `torch.nn.Module`, a `keras.Model`, a `flax.linen.Module`; its keyword '
              'arguments from `args.<name>` keys), or a zoo\'s model: `"torchvision:<name>"`, `"timm:<name>"`, '
              '`"hf:<model type>"` (Transformers, default config), `"keras:<application>"` (random weights)'))
    framework: str = setting(
        "torch", check=("registered",), named="axis",
        help=("the training framework: `torch`, `tensorflow`, `jax` (and plugins' backends); what each runs: "
              'the Frameworks reference'))
    device: str = setting(
        "cpu", check=("device",), named="axis",
        help=('`cpu`, `cuda`, `cuda:N` (`gpu`, `gpu:N` are aliases)'))
    batch_size: int | str = setting(
        64, check=("batch_size",), named="axis",
        help=('samples per step per device and micro-batch, an integer >= 1, or `"max"`: the largest batch that'
              ' trains, searched before the config runs (see `max_batch_start`, `max_batch_limit`)'))
    precision: str = setting(
        "fp32", check=("declared", "precision", PRECISIONS), named="axis",
        help=('`fp32` (true fp32: TF32 off), `tf32`, `amp-fp16`, `amp-bf16` (automatic mixed precision)'))
    parallelism: str = setting(
        "single", check=("parallelism",), named="axis",
        help=('`single`; `grad-accum:N` (N micro-batches of `batch_size` per optimizer step, every framework); '
              '`ddp:N` (PyTorch DistributedDataParallel, N processes started by torchrun, gloo on CPU, NCCL on '
              'GPU); `dp:N` (one process over N devices: PyTorch DataParallel over N GPUs; JAX `jax.jit` over a'
              ' mesh of N GPUs or N host devices); `fsdp:N` (fully sharded data parallel: PyTorch FSDP2 '
              '`fully_shard` per block and at the root, N processes as for `ddp:N`; each rank holds 1/N of the '
              'parameters, gradients and optimizer state; JAX: one process, the parameters and optimizer state '
              'split over a mesh of N devices); `tp:N` (tensor parallel: a transformer\'s attention '
              'and MLP projections split column- and row-wise over N processes by DTensor\'s '
              '`parallelize_module`, or in JAX over a mesh of N devices; every rank sees the whole batch); '
              '`fsdp:A+tp:B` (both on a 2-D mesh of A x B '
              'processes: `tp:B` within each group of B ranks, one replica, and FSDP across the A groups); '
              '`pipeline:N` (PyTorch '
              '`torch.distributed.pipelining`: N stages, one process each; `batch_size` is the batch every stage '
              'processes per step); '
              '`mirrored:N` (TensorFlow MirroredStrategy over N GPUs, or N logical CPU devices); '
              '`multiworker:N` (TensorFlow MultiWorkerMirroredStrategy, N worker processes). N is at most '
              f'{MAX_DEVICES} (devices or processes), {MAX_MICROBATCHES} for `grad-accum`'))
    optimizer: str = setting(
        "adam", check=("declared", "optimizer", OPTIMIZERS), named="changed", column=True,
        help=("`adam`, `adamw`, `sgd`: PyTorch's, built alike in every framework, with the settings below"))
    lr: float = setting(
        1e-3, check=("positive",), named="changed", column=True,
        help=('learning rate, a number > 0'))
    lr_warmup_steps: int = setting(
        0, check=("int", 0), named="changed", hashed_when_set=True,
        help=("optimizer steps over which the learning rate rises linearly to `lr` (step k, from 0, takes lr x "
              "(k + 1) / N; then `lr`), the same in every framework (but TensorFlow's `sgd` with momentum, whose "
              "velocity holds the rate of the step that added to it); 0: `lr` from the first step (an integer "
              ">= 0)"))
    beta1: float | None = setting(
        None, check=("fraction",), named="changed", column=True, hashed_when_set=True, used_when=_takes("beta1"),
        help=("`adam`, `adamw`: the first moment's decay, in [0, 1) (default 0.9)"))
    beta2: float | None = setting(
        None, check=("fraction",), named="changed", column=True, hashed_when_set=True, used_when=_takes("beta2"),
        help=("`adam`, `adamw`: the second moment's decay, in [0, 1) (default 0.999; 0.95 is usual for "
              'transformers)'))
    eps: float | None = setting(
        None, check=("positive",), named="changed", column=True, hashed_when_set=True, used_when=_takes("eps"),
        help=('`adam`, `adamw`: epsilon, added after the bias correction, a number > 0 (default 1e-8)'))
    weight_decay: float | None = setting(
        None, check=("non_negative",), named="changed", column=True, hashed_when_set=True,
        used_when=_takes("weight_decay"),
        help=('`adamw`: decoupled weight decay, the weights shrunk by lr x weight_decay each step, a number >= '
              '0 (default 0.01)'))
    momentum: float | None = setting(
        None, check=("fraction",), named="changed", column=True, hashed_when_set=True, used_when=_takes("momentum"),
        help=('`sgd`: momentum without dampening, in [0, 1) (default 0.9)'))
    loss: str = setting(
        "cross_entropy", check=("declared_or_function", "loss", LOSSES, "(outputs, targets) -> loss"),
        named="changed", column=True,
        help=('loss function: `cross_entropy`, or your function `"module:function"` taking (outputs, targets)'))
    compile: str = setting(
        "none", check=("declared", "compile", COMPILES), named="changed", column=True,
        help=('`none` (PyTorch eager; TensorFlow `tf.function`; JAX `jax.jit`, always XLA), `xla` (TensorFlow '
              '`jit_compile`), `torch-compile`, `torch-compile-reduce-overhead`, `torch-compile-max-autotune` '
              '(`torch.compile` with that mode; reduce-overhead on CUDA only), `cuda-graph` (the whole PyTorch '
              'step as one CUDA graph; CUDA, device data, not with `amp-fp16`, `ddp`/`dp`), `best` (each '
              'framework\'s strongest mode, for comparing frameworks on equal effort: PyTorch `torch-compile`, '
              '`torch-compile-reduce-overhead` on CUDA where the config allows it; TensorFlow `xla`; JAX `none`, '
              'its `jax.jit`; the config takes that mode as the suite expands)'))
    memory_format: str = setting(
        "contiguous", check=("declared", "memory_format", MEMORY_FORMATS), named="changed", column=True,
        help=('`contiguous`, `channels-last` (PyTorch: conv weights and 4-D inputs in NHWC memory order; a '
              'workload without a (C, H, W) input is `unsupported`; TensorFlow: `unsupported`, Keras is NHWC '
              'already)'))
    data: str = setting(
        "device", check=("declared", "data mode", DATA_MODES), named="changed", column=True,
        help=("`device` (batches resident on the device) or `pipeline` (the framework's input pipeline: PyTorch"
              ' DataLoader, `tf.data`; JAX: host batches put on the device one step ahead)'))
    data_workers: int = setting(
        2, check=("int", 0), named="changed", column=True, used_when=lambda c: c.data == "pipeline",
        named_when_used=True,
        help=('DataLoader worker processes with `data = "pipeline"` (PyTorch), an integer >= 0'))
    threads: int = setting(
        0, check=("int", 0), named="changed", column=True,
        help=("CPU threads a worker trains with: PyTorch's intra-op threads (`torch.set_num_threads`), "
              "TensorFlow's intra- and inter-op thread pools, JAX: the worker pinned to n CPUs (XLA sizes its "
              "pools from them); `0` leaves the framework's default. Part of the config id when set "
              '(`-threads=1`). Fewer threads can mean less noise on a small shared machine'))
    huge_pages: str = setting(
        "off", check=("values", "huge_pages", HUGE_PAGES), named="changed", column=True,
        help=("`off`, `transparent`: the worker starts with PyTorch's CPU allocator (`THP_MEM_ALLOC_ENABLE=1`) "
              "and glibc's malloc (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, glibc 2.35+) asking for transparent"
              " huge pages; `unsupported` where the kernel's THP mode is `never`. Steadier speed from one "
              'process to the next on a VM. Part of the config id when set'))
    dataset: str = setting(
        "synthetic", check=("declared_or_function", "dataset", DATASETS, "returning the training split"),
        named="changed", column=True,
        help=('`synthetic` (a learnable task made from the seed), `mnist` (IDX files from `data_dir`, its held-out '
              'split the `t10k` files), or your function `"module:function"` returning the training split: a '
              'PyTorch `Dataset` or `DataLoader`, a `tf.data.Dataset`, a pair of arrays `(inputs, targets)` or an '
              'iterable of `(inputs, targets)` batches; streamed epoch after epoch, shuffled per epoch with the '
              'seed (input shape and classes from the data where the suite does not say them)'))
    held_out: str = setting(
        "", check=("function", "held_out"), named="changed", hashed_when_set=True, used_when=_user_dataset,
        help=('with your `dataset`: your function `"module:function"` returning the held-out split, in the same '
              'forms; a `target_loss` is evaluated on all of it (or `eval_samples` of it)'))
    drop_last: bool = setting(
        True, check=("bool",), named="changed", hashed_when_set=True, used_when=_real_data, named_when_used=True,
        help=("with `mnist` or your `dataset`: `true` drops an epoch's last partial step; `false` completes it with "
              "the next epoch's first samples (no sample dropped)"))
    eval_samples: int = setting(
        0, check=("int", 0), named="changed", hashed_when_set=True, used_when=_real_data, named_when_used=True,
        help=("with `mnist` or your `held_out`: the held-out samples a `target_loss` evaluates, its first ones (0: "
              "all; an integer >= 0)"))
    data_dir: str = setting(
        "", check=("string",), used_when=lambda c: c.dataset == "mnist",
        help=('directory of `train-images-idx3-ubyte[.gz]` and `train-labels-idx1-ubyte[.gz]`, and for a '
              '`target_loss` `t10k-images-idx3-ubyte[.gz]` and `t10k-labels-idx1-ubyte[.gz]` (`dataset = "mnist"`)'))
    attention: str = setting(
        "sdpa", check=("declared", "attention", ATTENTIONS), named="changed", column=True, hashed_when_set=True,
        used_when=lambda c: c.workload in ATTENTION_WORKLOADS, named_when_used=True,
        help=("how a built-in transformer (`gpt`, `vit`) computes attention: `sdpa` (the framework's own, "
              "its choice of kernel: PyTorch `F.scaled_dot_product_attention`, JAX "
              "`jax.nn.dot_product_attention` (XLA's implementation); TensorFlow has no fused kernel: its matrix "
              "products), `math` "
              "(the two matrix products and a softmax: PyTorch's math kernel, the explicit graph in JAX and "
              "TensorFlow), `flash` (PyTorch's FlashAttention kernel: CUDA at amp-fp16/amp-bf16, or the CPU "
              "one), `efficient` (PyTorch's memory-efficient kernel, CUDA), `cudnn` (cuDNN's: PyTorch and JAX "
              "on CUDA at amp-fp16/amp-bf16); what a framework or device does not offer is `unsupported` "
              "with the reason"))
    optimizer_impl: str = setting(
        "auto", check=("declared", "optimizer implementation", OPTIMIZER_IMPLS), named="changed", column=True,
        hashed_when_set=True, used_when=lambda c: c.optimizer_impl != "auto", named_when_used=True,
        help=("how the optimizer's update runs: `auto` (PyTorch's fused kernels on CUDA, the framework's default "
              "elsewhere), `for-loop` (a loop over the parameters), `foreach` (one multi-tensor kernel per "
              "operation), `fused` (one kernel: PyTorch on CUDA or the CPU); a framework without the choice "
              "takes `auto` only"))
    checkpointing: str = setting(
        "none", check=("declared", "checkpointing", CHECKPOINTINGS), named="changed", column=True,
        help=('`none`, or `activations` (activation checkpointing: activations recomputed in the backward pass;'
              ' PyTorch: per run of layers; JAX: `jax.checkpoint` per top-level layer; not TensorFlow)'))
    warmup_steps: int = setting(
        5, check=("int", 0),
        help=('steps after the cold-start step, not measured; an integer >= 0'))
    steps: int = setting(
        20, check=("int", 1),
        help=('measured steps per window, an integer >= 1'))
    windows: int = setting(
        5, check=("int", 1),
        help=('measured windows, an integer >= 1'))
    window_s: float = setting(
        0.0, check=("non_negative",),
        help=('seconds a measured window may take, 0 for no bound: the warm-up stops once it has taken that '
              "long, and every window takes the steps that fit at the warm-up's step time, at least 2 (never "
              'more than `steps`), so a slow config takes fewer steps, never fewer windows'))
    timeout_s: float = setting(
        600.0, check=("positive",),
        help=("seconds > 0 before a config's worker is killed (`timeout`)"))
    target_loss: float = setting(
        0.0, check=("non_negative",), named="changed", hashed_when_set=True,
        help=("a number > 0: train from the initial weights until the loss on the held-out split (evaluated every "
              "`eval_every` steps) is at or below it, and measure the time to it (`time_to_target_s`, "
              "`steps_to_target`, `samples_to_target`) instead of timed windows; past `max_steps` or `max_time_s` "
              "the config ends `target_not_reached` with the best loss it reached. The held-out split: the "
              "synthetic task's held-out draw, MNIST's t10k files, your `held_out`. 0 (the default): no target"))
    eval_every: int = setting(
        20, check=("int", 1), named="changed", hashed_when_set=True, used_when=lambda c: c.target_loss > 0,
        named_when_used=True,
        help=("with `target_loss`: training steps between evaluations on held-out batches (an integer >= 1; the "
              "evaluation's time counts in the time to target, as MLPerf counts it)"))
    max_steps: int = setting(
        2000, check=("int", 1), named="changed", hashed_when_set=True, used_when=lambda c: c.target_loss > 0,
        named_when_used=True,
        help="with `target_loss`: the training steps after which a config that has not reached it stops")
    max_time_s: float = setting(
        300.0, check=("positive",), named="changed", hashed_when_set=True, used_when=lambda c: c.target_loss > 0,
        named_when_used=True,
        help=("with `target_loss`: the seconds of training after which a config that has not reached it stops "
              "(at the next evaluation; keep it well below `timeout_s`)"))
    telemetry_interval_ms: int = setting(
        100, check=("int", 0),
        help=('telemetry sampling period in ms, an integer >= 0; 0 turns sampling off (also '
              '`--telemetry-interval-ms`, or `interval_ms` in a `[telemetry]` table)'))
    max_batch_start: int = setting(
        64, check=("int", 1), used_when=lambda c: c.batch_size == MAX_BATCH,
        help=('`batch_size = "max"`: the first batch the search tries (an integer >= 1, at most '
              '`max_batch_limit`)'))
    max_batch_limit: int = setting(
        65536, check=("int", 1), used_when=lambda c: c.batch_size == MAX_BATCH,
        help=('`batch_size = "max"`: the largest batch the search tries'))
    pipeline_microbatches: int = setting(
        4, check=("int", 1), named="changed", used_when=lambda c: c.pipelined, named_when_used=True,
        help=('`pipeline:N`: micro-batches each batch is split into (must divide `batch_size`)'))
    pipeline_schedule: str = setting(
        "gpipe", check=("values", "pipeline schedule", PIPELINE_SCHEDULES), named="changed",
        used_when=lambda c: c.pipelined, named_when_used=True,
        help=('`pipeline:N`: the `torch.distributed.pipelining` schedule, `gpipe` or `1f1b`'))
    fsdp_reshard: str = setting(
        "after-forward", check=("values", "fsdp reshard", FSDP_RESHARDS), named="changed", hashed_when_set=True,
        used_when=lambda c: c.parallel.size("fsdp") > 0, named_when_used=True,
        help=('`fsdp:N` (and `fsdp:A+tp:B`): when a block\'s gathered parameters are freed: `after-forward` (FSDP2\'s '
              '`reshard_after_forward=True`, ZeRO-3: gathered again for the backward) or `after-backward` '
              '(kept from the forward to the backward: one all-gather fewer a block, more memory)'))
    nnodes: int = setting(
        1, check=None, named="changed",
        help=('nodes of a multi-node run (`run --nnodes`; not a suite key): a distributed config runs its N '
              'processes on every node'))
    seed: int = setting(
        0, check=("int", 0, SEED_MAX), named="changed",
        help=('seed for weights, data and dropout, an integer >= 0'))
    input_shape: tuple[int, ...] = setting(
        (), check=("input_shape",), hashed_when_set=True, used_when=_own_model_or_data,
        help=("a model that is not a built-in workload: one sample's shape as the model takes it (`[3, 32, 32]` "
              "for a PyTorch image model, `[32, 32, 3]` for a Keras one, `[128]` tokens for a language model); not "
              "needed where the model declares it (a built Keras model, a zoo's default) or on your `dataset` (its "
              "samples')"))
    num_classes: int = setting(
        0, check=("int", 0), hashed_when_set=True, used_when=_own_model_or_data,
        help=('a model that is not a built-in workload: the classes of the synthetic task its outputs score (0:'
              " the model's own, where it declares them); on your `dataset`, the classes a built-in scores (0: the "
              "data's, its largest label + 1)"))
    input_kind: str = setting(
        "auto", check=("values", "input kind", INPUT_KINDS), hashed_when_set=True, used_when=_own_model,
        help=("a model that is not a built-in workload, on gpubench's synthetic data: `tokens` (integer token "
              "sequences of `input_shape = [T]` over a vocabulary of `num_classes`, a learnable next-token task "
              "with (batch, T) targets, and tokens/s), `features` (float arrays of `input_shape`, a class per "
              "sample), `auto` (tokens where the model's first layer is an embedding, said in the run's notes; "
              "else features)"))
    loss_output: str = setting(
        "", check=("loss_output",), named="changed", hashed_when_set=True, used_when=_own_model,
        help=("a model that computes its own loss: where its output holds it, a field or key name (`loss`: "
              "`out.loss`, `out[\"loss\"]`) or a tuple's position (`1`: nanoGPT's `(logits, loss)`); the model "
              "is called with the targets after the inputs (`model(x, y)`) unless a batch function puts them "
              "among the inputs; the loss key is then not used"))
    batches: str = setting(
        "", check=("function", "batches"), named="changed", hashed_when_set=True, used_when=_own_model,
        help=('your batch function `"module:function"`: called with a batch size, returns (inputs, targets), '
              "inputs any structure the model takes (an array, a tuple, a dict); none: gpubench's synthetic "
              'data'))
    # a built-in workload's parameters (depth=2), or a factory's keyword arguments (args.width)
    workload_params: tuple[tuple[str, Any], ...] = ()
    # settings named in the id because another point of this config's sweep differs from it in
    # them (set by the suite's expansion: see gpubench.suite.name_differences); not a setting
    id_keys: tuple[str, ...] = ()
    # a target_loss config's repeat (convergence varies from seed to seed): trial r > 0 starts
    # from weights of its own seed and trains on its own draw of the task's samples, the task
    # kept; set by the worker from its job, not a setting, not in the id or the hash
    trial: int = 0

    @property
    def init_seed(self) -> int:
        """The seed of the weights and of the framework's generators (dropout, a key): ``seed``,
        or for trial r > 0 one of its own (the task, made from ``seed``, stays)."""
        return self.seed if self.trial == 0 else (self.seed + TRIAL_SEED_STRIDE * self.trial) % (SEED_MAX + 1)

    @cached_property
    def parallel(self) -> Parallelism:
        """The ``parallelism`` setting parsed, once: its kind, its devices and each axis's size
        (every reader asks this, none parses the text)."""
        return parse_parallelism(self.parallelism)

    @property
    def accum_steps(self) -> int:
        """Micro-batches per optimizer step (``grad-accum:N``; 1 otherwise)."""
        return self.parallel.size("grad-accum") or 1

    def optimizer_settings(self) -> dict[str, float]:
        """Every setting of this config's optimizer, the suite's value where set, else the
        default (adamw with ``beta2 = 0.95`` and ``weight_decay = 0.1`` set: ``{"beta1": 0.9,
        "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}``)."""
        defaults = OPTIMIZER_SETTINGS.get(self.optimizer, {})
        return {k: float(v) if (v := getattr(self, k)) is not None else d for k, d in defaults.items()}

    @property
    def distributed(self) -> bool:
        """One process per rank, started by a launcher (``ddp:N``, ``fsdp:N``, ``tp:N``,
        ``fsdp:A+tp:B``, ``pipeline:N``, ``multiworker:N``, also N = 1; JAX's ``fsdp:N`` is one
        process over a mesh)."""
        kind = self.parallel.kind
        return kind in DISTRIBUTED_KINDS and not (kind in MESH_SHARDED_KINDS and self.framework in MESH_FRAMEWORKS)

    @property
    def pipelined(self) -> bool:
        """``pipeline:N``: the model split into N stages, each on its own device."""
        return self.parallel.kind in STAGE_KINDS

    @property
    def devices(self) -> int:
        """Devices (ranks, replicas or pipeline stages) one optimizer step runs on; a
        distributed config has N on each of ``nnodes`` nodes."""
        kind, n = self.parallel.kind, self.parallel.n
        if kind not in REPLICA_KINDS + STAGE_KINDS + TENSOR_KINDS:
            return 1
        return n * self.nnodes if kind in DISTRIBUTED_KINDS else n

    @property
    def local_cuda_ordinals(self) -> tuple[int, ...]:
        """The CUDA ordinals this config trains on, on each node: ``cuda:K`` -> (K,); a
        multi-device config (``device = cuda``) puts rank, replica or stage r on cuda:r; a
        CPU config uses none."""
        if device_kind(self.device) != "cuda":
            return ()
        kind, n = self.parallel.kind, self.parallel.n
        return (tuple(range(n)) if kind in REPLICA_KINDS + STAGE_KINDS + TENSOR_KINDS
                else (device_index(self.device),))

    @property
    def tensor_parallel(self) -> int:
        """The ranks each tensor-parallel layer is split over, which all see the same samples
        (``tp:N``: every rank, N on each node; ``fsdp:A+tp:B``: B, within a node; 1 otherwise)."""
        if self.parallel.kind == "tp":
            return self.devices
        return self.parallel.size("tp") or 1

    @property
    def replicas(self) -> int:
        """Data-parallel replicas, each taking ``batch_size`` samples of every global batch
        (pipeline stages all see the same samples: 1; ``fsdp:A+tp:B``: A on each node)."""
        return 1 if self.pipelined else self.devices // self.tensor_parallel

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
            kinds = ", ".join(parallel_form(k) for k in DISTRIBUTED_KINDS)
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
                 if getattr(self, name) != DEFAULTS[name] and (name not in _NAMED_WHEN_USED or self.uses(name))]
        named += [name for name in self.id_keys if name not in named]
        return "-".join(f"{name}={_id_value(name, getattr(self, name))}" for name in named)

    @property
    def config_id(self) -> str:
        """Stable, readable id: the identity axes, plus any other training setting that
        differs from its built-in default, plus the settings that tell this config from the
        other points of its sweep (``id_keys``, set by the suite's expansion), so that no two
        points of a sweep share an id."""
        parts = [self.workload_label, self.framework, self.device, f"bs{self.batch_size}", self.precision,
                 self.parallelism.replace(":", "")]  # grad-accum:4 -> grad-accum4, fsdp:2+tp:2 -> fsdp2+tp2
        return "-".join(parts + ([self.variant] if self.variant else []))

    @property
    def config_hash(self) -> str:
        """Short hash of every setting (``id_keys`` is how the id is written, not a setting),
        so that results of the same settings are one series wherever they ran."""
        d = self.to_dict()
        del d["id_keys"]
        d.pop("trial", None)
        for name, default in _HASH_DEFAULTS.items():  # settings added later: a config without them keeps its hash
            if d[name] == default:
                del d[name]
        blob = json.dumps(d, sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:12]

    def uses(self, name: str) -> bool:
        """Whether this config uses the setting ``name`` (a setting declared ``used_when``, such as
        a transformer's attention, is not used elsewhere: it is neither checked nor named there)."""
        used = _USED_ONLY_WHEN.get(name)
        return used is None or used(self)

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
        if not self.trial:  # a config as the suite made it (a worker's trial is its own)
            del d["trial"]
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

_SCALAR = (bool, int, float, str, type(None))
_ANNOTATED: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
                                           "None": (type(None),)}


def _value_problem(name: str, annotation: str, value: Any) -> str | None:
    """What is wrong with the type of a stored config's ``name`` (by the field's annotation), or None."""
    if name == "workload_params":
        ok = isinstance(value, dict) and all(isinstance(v, _SCALAR) for v in value.values())
        wanted = "an object of numbers, strings and booleans"
    elif name in ("id_keys", "input_shape"):
        item = str if name == "id_keys" else int
        ok = isinstance(value, list) and all(isinstance(v, item) and not isinstance(v, bool) for v in value)
        ok = ok and (name != "id_keys" or set(value) <= _NAMES)
        wanted = "a list of setting names" if name == "id_keys" else "a list of integers"
    else:
        types = tuple(t for part in annotation.split("|") for t in _ANNOTATED.get(part.strip(), ()))
        ok = isinstance(value, types) and (bool not in types) == (not isinstance(value, bool))
        wanted = " or ".join(part.strip().replace("None", "null") for part in annotation.split("|"))
    return None if ok else f"'config.{name}' is {type(value).__name__} {json.dumps(value, default=str)[:40]}, " \
                           f"not {wanted}"


def config_problem(d: dict[str, Any]) -> str | None:
    """What is wrong with the types of a stored config (a result line's ``config``, written by
    ``to_dict``), by the annotations of Config's fields; None where every field it has is of its
    type. Readers build a Config from it (``from_dict``) and use its values."""
    for f in fields(Config):
        if f.name in d and (problem := _value_problem(f.name, str(f.type), d[f.name])):
            return problem
    return None


_NAMES = frozenset(DEFAULTS)
# every declared setting (nnodes included: a run's, not a suite's), in declaration order
SETTING_FIELDS: tuple[Field[Any], ...] = tuple(f for f in fields(Config) if f.metadata.get("setting"))
SUITE_KEYS = tuple(f.name for f in SETTING_FIELDS if f.metadata["check"] is not None)
# the training settings named in the id where they differ from their default (some only where
# the config uses them); every setting but the identity axes, always in the id, may be named
# where a sweep varies it (id_keys)
_ID_EXTRAS = tuple(f.name for f in SETTING_FIELDS if f.metadata["named"] == "changed")
_NAMED_WHEN_USED = {f.name for f in SETTING_FIELDS if f.metadata["named_when_used"]}
NAMEABLE = tuple(f.name for f in SETTING_FIELDS if f.metadata["named"] != "axis")
# settings hashed only where set (added after results were recorded under hashes without them),
# with their value as to_dict writes it
_HASH_DEFAULTS: dict[str, Any] = {f.name: list(f.default) if isinstance(f.default, tuple) else f.default
                                  for f in SETTING_FIELDS if f.metadata["hashed_when_set"]}
# the results frame's and results.csv's setting columns
COLUMNS = tuple(f.name for f in SETTING_FIELDS if f.metadata["column"])
# the settings each backend declares the values of it supports (Backend.capabilities), in the
# order a config's problems are reported
BACKEND_CHECKED = tuple(f.name for f in SETTING_FIELDS if f.metadata["check"] is not None
                        and f.metadata["check"][0] in ("declared", "declared_or_function", "parallelism"))
# those of them that also take the user's function ("module:function")
FUNCTION_CHECKED = tuple(f.name for f in SETTING_FIELDS if f.metadata["check"] is not None
                         and f.metadata["check"][0] == "declared_or_function")

# settings a config uses only where this holds (Config.normalised sets them to their default
# elsewhere)
_USED_ONLY_WHEN: dict[str, Callable[[Config], bool]] = {
    f.name: f.metadata["used_when"] for f in SETTING_FIELDS if f.metadata["used_when"] is not None}


def _id_value(name: str, value: Any) -> str:
    """A setting's value as the id writes it: a path as its last part and a short hash of the
    whole (readable, and two directories with the same last part stay apart)."""
    if name == "input_shape":
        return "x".join(map(str, value))
    if name in ("batches", "loss", "dataset", "held_out"):
        return str(value).replace(":", ".")
    if name == "data_dir":
        digest = hashlib.sha1(str(value).encode()).hexdigest()[:6]
        return f"{Path(str(value)).name or 'none'}.{digest}"
    return str(value)
