"""The TensorFlow trainer: a Keras model, a Keras optimizer and a tf.function training step."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf

from gpubench.backends.base import Lap, NativeModel, ProfilingUnavailable, Trainer, Tree, Unsupported
from gpubench.backends.tensorflow.layout import nhwc_data
from gpubench.backends.tensorflow.native import POLICIES, as_native, builtin_loss
from gpubench.backends.tensorflow.runtime import PORT_BASE_ENV, SLURM_CLUSTER_ENV, import_tf, tf_device
from gpubench.config import Config
from gpubench.launch import WORKERS_ENV
from gpubench.measure.timers import HostStepTimer, StepTimer, WindowTimer
from gpubench.options import OPTIMIZER_SETTINGS, device_kind
from gpubench.workloads.base import WorkloadSpec
from gpubench.workloads.data import Batches, tree_map

if TYPE_CHECKING:
    from gpubench.backends.tensorflow.profiling import PhaseFunctions

import_tf()  # GPU memory growth on before anything touches a GPU, however the trainer is built


class Warmup(keras.optimizers.schedules.LearningRateSchedule):
    """``lr_warmup_steps``: step k (from 0) at lr x (k + 1) / steps, then lr, as PyTorch's."""

    def __init__(self, lr: float, steps: int) -> None:
        self.lr, self.steps = lr, steps

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        return self.lr * tf.minimum(1.0, (tf.cast(step, tf.float32) + 1.0) / self.steps)

    def get_config(self) -> dict[str, Any]:
        return {"lr": self.lr, "steps": self.steps}


def make_optimizer(name: str, lr: float, settings: dict[str, float] | None = None, warmup_steps: int = 0
                   ) -> keras.optimizers.Optimizer:
    """The same optimizers and settings as the PyTorch backend (``Config.optimizer_settings()``;
    the defaults of ``options.OPTIMIZER_SETTINGS`` where None). Keras' Adam adds epsilon before
    bias correction of the second moment ("epsilon hat"), PyTorch after it: with epsilon 1e-8
    both give the same updates unless gradients are near epsilon. ``warmup_steps``: Warmup."""
    s = {**OPTIMIZER_SETTINGS.get(name, {}), **(settings or {})}
    rate: float | Warmup = Warmup(lr, warmup_steps) if warmup_steps > 0 else lr
    if name == "adam":
        return keras.optimizers.Adam(learning_rate=rate, beta_1=s["beta1"], beta_2=s["beta2"], epsilon=s["eps"])
    if name == "adamw":
        return keras.optimizers.AdamW(learning_rate=rate, weight_decay=s["weight_decay"], beta_1=s["beta1"],
                                      beta_2=s["beta2"], epsilon=s["eps"])
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=rate, momentum=s["momentum"])
    raise ValueError(f"unknown optimizer {name!r}")


def logical_cpus(n: int) -> None:
    """Split the CPU into ``n`` logical devices (mirrored:N on a CPU), which must happen before
    TensorFlow initialises its devices: the first thing a worker does with TensorFlow."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    except RuntimeError:  # TensorFlow is already initialised in this process (a test's second trainer)
        pass


def _mirrored_strategy(n: int, gpu: bool) -> tf.distribute.Strategy:
    if gpu:
        return tf.distribute.MirroredStrategy(devices=[f"/GPU:{i}" for i in range(n)])
    logical_cpus(n)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) != n:
        raise RuntimeError(f"mirrored:{n} needs {n} logical CPU devices; TensorFlow was initialised with "
                           f"{len(devices)} before this config could set them up")
    return tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=tf.distribute.ReductionToOneDevice())


class _SlurmResolver(tf.distribute.cluster_resolver.SlurmClusterResolver):
    """TensorFlow's SlurmClusterResolver, with this worker's task index the RANK gpubench gave
    it: the resolver lists the workers by host name sorted as text, but takes a task's index
    from SLURM_PROCID, which follows Slurm's node order (``gpu9`` before ``gpu10``), so the
    two can disagree; gpubench.runner.slurm.slurm_ranks numbers the ranks the resolver's way."""

    def _resolve_own_rank(self) -> int:
        return int(os.environ["RANK"])


def _multiworker_strategy(gpu: bool) -> tf.distribute.Strategy:
    """One replica per worker process (worker r of a node on its /GPU:r, or on the CPU), in
    the cluster that TF_CONFIG describes (made here from the worker list and RANK that
    gpubench.runner.ranks gives every worker) or, for a worker that srun started (gpubench run
    --launcher slurm), the one TensorFlow's SlurmClusterResolver reads from Slurm's variables
    (worker ports from PORT_BASE_ENV on every node). Collectives: NCCL between GPUs, ring
    all-reduce over gRPC between CPUs."""
    gpus = tf.config.list_physical_devices("GPU")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    tf.config.set_visible_devices([gpus[local]] if gpu else [], "GPU")
    comm = tf.distribute.experimental.CommunicationImplementation
    options = tf.distribute.experimental.CommunicationOptions(implementation=comm.NCCL if gpu else comm.RING)
    resolver = None
    if WORKERS_ENV in os.environ:
        os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": json.loads(os.environ[WORKERS_ENV])},
                                              "task": {"type": "worker", "index": int(os.environ["RANK"])}})
    if os.environ.get(SLURM_CLUSTER_ENV) == "slurm":
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        # one device per task, chosen above by LOCAL_RANK (auto_set_gpu would set CUDA_VISIBLE_DEVICES
        # after TensorFlow has seen the GPUs); on CPUs the "GPU" counts only shape the port layout
        resolver = _SlurmResolver(port_base=int(os.environ[PORT_BASE_ENV]), gpus_per_node=per_node,
                                  gpus_per_task=1, auto_set_gpu=False)
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)


_GATHER_BYTES = 1 << 14  # room for one rank's summary in all_gather


def _micro(tree: Tree[tf.Tensor], k: int) -> Tree[tf.Tensor]:
    """Micro-batch ``k`` of a pipeline element holding the micro-batches of one step."""
    return tree_map(lambda a: a[k], tree)


class TFTrainer(Trainer):
    def __init__(self, native: NativeModel | WorkloadSpec, config: Config, batches: Batches) -> None:
        native = as_native(native, config)
        if config.checkpointing != "none":
            raise Unsupported("checkpointing is a PyTorch setting here")
        self.gpu = device_kind(config.device) == "cuda"
        self.device = tf_device(config.device)
        self.xla = config.compile == "xla"
        self.pipeline = config.data == "pipeline"
        self._phases: PhaseFunctions | None = None  # the breakdown pass's separate tf.functions, built on first use
        self._eval: Callable[[Any, Any], tf.Tensor] | None = None  # evaluate's tf.function, built on first use
        # mirrored:N: N replicas (GPUs, or logical CPU devices, which must be set up before
        # TensorFlow initialises its devices); data: every global batch split over them
        # multiworker:N: one replica per worker process, N per node (_multiworker_strategy)
        kind = config.parallel.kind
        self.parallelism = config.parallelism
        self.strategy = (_mirrored_strategy(config.devices, self.gpu) if kind == "mirrored" else
                         _multiworker_strategy(self.gpu) if kind == "multiworker" else None)
        if kind == "multiworker":
            self.rank, self.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        # fp32 means true fp32: TensorFlow enables TF32 on Ampere+ GPUs by default
        tf.config.experimental.enable_tensor_float_32_execution(config.precision == "tf32")
        keras.utils.set_random_seed(config.init_seed)
        policy = POLICIES.get(config.precision)
        self.accum = config.accum_steps
        # a built-in spec's data is channels first (C, H, W); Keras takes channels last
        self._channels_first = native.channels_first_data
        x = nhwc_data(batches.x, batches.x.ndim - 2) if native.channels_first_data else batches.x
        self.loss_fn = native.loss or builtin_loss()
        self._first_x = tree_map(lambda a: a[0], x)  # one batch, to build a model that declares no input
        if self.strategy is not None:
            if batches.structured:
                raise Unsupported(f"{config.parallelism} distributes one input array per batch; this model takes "
                                  "several")
            self._init_mirrored(native, config, x, batches.y, policy)
            return
        with tf.device(self.device):
            self._build_model(native, config)
            if self.pipeline:
                def flat(a: np.ndarray) -> np.ndarray:
                    return a.reshape(-1, *a.shape[2:])

                ds = tf.data.Dataset.from_tensor_slices((tree_map(flat, x), tree_map(flat, batches.y)))
                ds = ds.batch(batches.batch_size, drop_remainder=True)
                if self.accum > 1:  # one element = the micro-batches of one optimizer step
                    ds = ds.batch(self.accum, drop_remainder=True)
                ds = ds.repeat()
                if self.gpu:
                    ds = ds.apply(tf.data.experimental.prefetch_to_device(self.device))
                else:
                    ds = ds.prefetch(tf.data.AUTOTUNE)
                self._iter = iter(ds)
                self._step = tf.function(self._train_step, jit_compile=self.xla)
            else:
                self.x = tree_map(tf.constant, x)
                self.y = tree_map(tf.constant, batches.y)
                self.n_batches = batches.n_batches
                self.counter = tf.Variable(0, dtype=tf.int64, trainable=False)
                self._step = tf.function(self._device_step, jit_compile=self.xla)
        self._finish_init(config, policy, data="tf.data(prefetch)" if self.pipeline else "device-resident")

    def _finish_init(self, config: Config, policy: str | None, data: str, distributed: str | None = None) -> None:
        """What every trainer records in ``runtime``; the GPU synchronised, its peaks reset."""
        self._losses: list[tf.Tensor] = []  # every unread step's loss, on the device
        self._info = {
            "optimizer_impl": "keras",
            "mixed_precision_policy": policy,
            "loss_scale": self.scaled,
            "tf32": config.precision == "tf32",
            "xla": self.xla,
            "compile": {"setting": config.compile,
                        "how": "tf.function(jit_compile=True): the step XLA-compiled" if self.xla
                        else "tf.function: the step as a TensorFlow graph"},
            "step_timing": "window_mean" if self.gpu else "host_clock",
            "grad_accum": self.accum,
            "checkpointing": "none",
            "distributed": distributed,
            "data": data,
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        }
        if self.gpu:
            self.sync()
            tf.config.experimental.reset_memory_stats(self._memory_device)

    def _build_model(self, native: NativeModel, config: Config) -> None:
        """Model and optimizer (loss-scaled for amp-fp16), built under the caller's device or
        strategy scope so that their variables are placed there."""
        self.model = native.build()
        if not self.model.built:  # a model that declares no input: its weights from a first call
            self.model(self._first_x, training=False)
        optimizer = make_optimizer(config.optimizer, config.lr, config.optimizer_settings(), config.lr_warmup_steps)
        self.scaled = config.precision == "amp-fp16"
        if self.scaled:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(self.model.trainable_variables)
        self.optimizer = optimizer

    def _init_mirrored(self, native: NativeModel, config: Config, x: np.ndarray, y: np.ndarray,
                       policy: str | None) -> None:
        """MirroredStrategy (this process's replicas are all of them; ``x``, ``y`` the global
        batches) and MultiWorkerMirroredStrategy (``x``, ``y`` this worker's shard of every
        global batch): replica r trains on slice r of each global batch."""
        strategy = self.strategy
        assert strategy is not None  # only mirrored and multiworker configs come here
        with strategy.scope():  # variables mirrored on every replica
            self._build_model(native, config)
        local = len(strategy.extended.worker_devices)  # replicas in this process
        first = self.rank * local  # the global replica id of the first of them
        n_batches, local_batch = y.shape[:2]  # a token task's targets are (n, batch, T)
        b = local_batch // local
        global_batch = b * strategy.num_replicas_in_sync
        # per example; each replica's mean is over the global batch, so the replicas' gradients
        # sum (the optimizer all-reduces them) to the gradient of the global batch's mean loss
        if native.loss is not None:
            raise Unsupported(f"{config.parallelism} averages a per-example loss over the global batch; a loss "
                              "function of your own gives one number per replica")
        sparse = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

        def per_example(yb: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
            losses = sparse(yb, tf.cast(logits, tf.float32))
            # a sequence's loss is the mean over its tokens, so the global batch's mean is the
            # mean over every token, as on one device
            return tf.reduce_mean(losses, axis=list(range(1, len(losses.shape)))) if len(losses.shape) > 1 else losses

        def replica_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
            variables = self.model.trainable_variables
            with tf.GradientTape() as tape:
                logits = self.model(xb, training=True)
                loss = tf.nn.compute_average_loss(per_example(yb, logits), global_batch_size=global_batch)
                target = self.optimizer.scale_loss(loss) if self.scaled else loss
            grads = tape.gradient(target, variables)
            self.optimizer.apply_gradients(zip(grads, variables))
            return loss

        def total(per_replica: tf.distribute.DistributedValues) -> tf.Tensor:
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        if self.pipeline:  # tf.data: this process's consecutive per-replica batches go to its replicas in turn
            ds = tf.data.Dataset.from_tensor_slices((x.reshape(-1, *x.shape[2:]), y.reshape(-1, *y.shape[2:])))
            ds = ds.batch(b, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE)
            self._iter = iter(strategy.distribute_datasets_from_function(lambda ctx: ds))
            self._step = tf.function(lambda xb, yb: total(strategy.run(replica_step, args=(xb, yb))),
                                     jit_compile=self.xla)
        else:  # device-resident: replica r holds slice r of every global batch
            xr = x.reshape(n_batches, local, b, *x.shape[2:])
            yr = y.reshape(n_batches, local, b, *y.shape[2:])
            xs = strategy.experimental_distribute_values_from_function(
                lambda ctx: tf.constant(xr[:, ctx.replica_id_in_sync_group - first]))
            ys = strategy.experimental_distribute_values_from_function(
                lambda ctx: tf.constant(yr[:, ctx.replica_id_in_sync_group - first]))
            counter = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.x, self.y, self.counter = xs, ys, counter

            def device_step() -> tf.Tensor:
                i = counter % n_batches
                counter.assign_add(1)
                return total(strategy.run(lambda xv, yv: replica_step(tf.gather(xv, i), tf.gather(yv, i)),
                                          args=(xs, ys)))

            self._step = tf.function(device_step, jit_compile=self.xla)
        data = "tf.data(distributed)" if self.pipeline else "device-resident (per replica)"
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            cluster = ("SlurmClusterResolver" if os.environ.get(SLURM_CLUSTER_ENV) == "slurm" else "TF_CONFIG")
            distributed = (f"MultiWorkerMirroredStrategy({'NCCL' if self.gpu else 'RING'}, "
                           f"workers={self.world_size}, cluster={cluster})")
        else:
            distributed = f"MirroredStrategy({', '.join(strategy.extended.worker_devices)})"
        self._finish_init(config, policy, data, distributed=distributed)

    @property
    def _memory_device(self) -> str:
        return self.device.lstrip("/")

    def _train_step(self, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        # the device scope is inside the traced function, so placement is part of the graph
        # (entering tf.device on every eager call costs ~9 us per step)
        with tf.device(self.device):
            if self.accum == 1:
                return self._train_step_body([(x, y)])
            return self._train_step_body([(_micro(x, k), _micro(y, k)) for k in range(self.accum)])

    def _forward_loss(self, x: tf.Tensor, y: tf.Tensor, n_micro: int) -> tf.Tensor:
        """Forward and loss of one micro-batch (its share of the mean over ``n_micro``)."""
        loss = self.loss_fn(y, self.model(x, training=True))
        return loss / n_micro if n_micro > 1 else loss

    def _gradients(self, x: tf.Tensor, y: tf.Tensor, n_micro: int) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """(loss, gradients) of one micro-batch; loss-scaled gradients for amp-fp16."""
        with tf.GradientTape() as tape:
            loss = self._forward_loss(x, y, n_micro)
            target = self.optimizer.scale_loss(loss) if self.scaled else loss
        return loss, tape.gradient(target, self.model.trainable_variables)

    def _apply(self, grads: list[tf.Tensor]) -> None:
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))  # unscales, skips non-finite

    def _train_step_body(self, micro: list[tuple[tf.Tensor, tf.Tensor]]) -> tf.Tensor:
        """One optimizer update from one batch, or (gradient accumulation) from the mean loss
        over several micro-batches: their gradients summed, one update. Returns the loss."""
        (x0, y0), rest = micro[0], micro[1:]
        total, grads = self._gradients(x0, y0, len(micro))
        for x, y in rest:  # unrolled when traced
            loss, part = self._gradients(x, y, len(micro))
            grads = [a + b for a, b in zip(grads, part)]
            total = total + loss
        self._apply(grads)
        return total

    def _next_device_batch(self) -> tuple[tf.Tensor, tf.Tensor]:
        i = self.counter % self.n_batches
        self.counter.assign_add(1)
        return tree_map(lambda a: tf.gather(a, i), self.x), tree_map(lambda a: tf.gather(a, i), self.y)

    def _device_step(self) -> tf.Tensor:
        with tf.device(self.device):
            return self._train_step_body([self._next_device_batch() for _ in range(self.accum)])

    def step(self) -> None:
        if self.pipeline:
            self._losses.append(self._step(*next(self._iter)))
        else:
            self._losses.append(self._step())

    def sync(self) -> None:
        if self.gpu:
            tf.test.experimental.sync_devices()

    def evaluate(self, batches: Batches) -> float:
        """The mean loss over held-out ``batches``: the model called with ``training=False``
        (no dropout, batch norm's moving statistics), no update; each batch through one
        tf.function (traced once, XLA-compiled where the step is), as the step runs, not eager
        Keras calls."""
        if self._eval is None:
            self._eval = tf.function(lambda x, y: self.loss_fn(y, self.model(x, training=False)),
                                     jit_compile=self.xla)
        x = nhwc_data(batches.x, batches.x.ndim - 2) if self._channels_first else batches.x
        losses = []
        with tf.device(self.device):
            for i in range(batches.n_batches):
                xi, yi = (tree_map(lambda a: tf.convert_to_tensor(a[i]), t) for t in (x, batches.y))  # noqa: B023
                losses.append(self._eval(xi, yi))
            return float(tf.reduce_mean(tf.stack(losses)))  # one read: no host synchronisation a batch

    def read_losses(self) -> list[float]:
        losses, self._losses = self._losses, []
        return [float(v) for v in np.asarray(tf.stack(losses), dtype=np.float64)] if losses else []

    def all_gather(self, obj: object) -> list[Any]:
        """Every worker's ``obj`` in rank order, through the strategy's own all-gather (the
        JSON bytes, zero-padded to a fixed length)."""
        if self.world_size == 1:
            return [obj]
        data = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
        if len(data) > _GATHER_BYTES:
            raise ValueError(f"all_gather: {len(data)} bytes, more than {_GATHER_BYTES}")
        buf = np.zeros((1, _GATHER_BYTES), dtype=np.int32)
        buf[0, :len(data)] = data
        strategy = self.strategy
        assert strategy is not None  # several workers: multiworker, whose strategy gathers
        value = strategy.experimental_distribute_values_from_function(lambda ctx: tf.constant(buf))
        rows = strategy.gather(value, axis=0).numpy()
        return [json.loads(bytes(row.astype(np.uint8)).rstrip(b"\0")) for row in rows]

    def compile_events(self) -> int | None:
        # the step's tf.function: one trace per input signature (a retrace would add one)
        count = getattr(self._step, "experimental_get_tracing_count", None)
        return int(count()) if callable(count) else None

    def weights_digest(self) -> str | None:
        h = hashlib.sha1()
        for v in self.model.trainable_variables:
            h.update(np.asarray(v.numpy(), dtype=np.float32).tobytes())
        return h.hexdigest()

    def step_timer(self, n_steps: int) -> StepTimer:
        return WindowTimer(n_steps) if self.gpu else HostStepTimer(n_steps)

    def memory(self) -> dict[str, int]:
        if not self.gpu:
            return {}
        info = tf.config.experimental.get_memory_info(self._memory_device)
        return {"peak_allocated_bytes": int(info["peak"])}

    def describe(self) -> dict[str, Any]:
        return dict(self._info)

    def phased_step(self, lap: Lap) -> None:
        if self.strategy is not None:
            raise ProfilingUnavailable(f"{self.parallelism} runs each step across replicas in one tf.function; "
                                       "its phases are not timed apart")
        if self._phases is None:
            from gpubench.backends.tensorflow.profiling import PhaseFunctions, StepParts

            n = self.accum
            self._phases = PhaseFunctions(StepParts(
                forward_loss=lambda x, y: self._forward_loss(x, y, n), gradients=lambda x, y: self._gradients(x, y, n),
                apply=self._apply, next_device_batch=None if self.pipeline else self._next_device_batch,
                next_element=(lambda: next(self._iter)) if self.pipeline else None, accum=n, device=self.device,
                xla=self.xla))
        self._losses.append(self._phases.step(lap))

    def profile(self, steps: int, out_dir: Path) -> dict[str, Any]:
        from gpubench.backends.tensorflow.profiling import profile_steps

        return profile_steps(self, steps, out_dir, gpu=self.gpu)
