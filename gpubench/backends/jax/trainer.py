"""The JAX trainer: the spec as a pure function, Optax's optimizers, and the whole training step
(data indexing, forward, loss, backward, accumulation, loss scaling, update) as one ``jax.jit``
program with its state donated, so a step is one dispatch and never waits for the device."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from gpubench.backends.base import Lap, NativeModel, ProfilingUnavailable, Trainer, Tree, Unsupported, spec_native
from gpubench.backends.jax.model import JaxModel, Policy, cross_entropy, policy_for, spec_model
from gpubench.config import Config
from gpubench.measure.timers import StepTimer, WindowTimer
from gpubench.options import OPTIMIZER_SETTINGS, device_index, device_kind
from gpubench.workloads.base import TransformerBlock, WorkloadSpec
from gpubench.workloads.data import Batches, tree_map

Arrays = Tree[jax.Array]  # parameters, optimizer state, batch-norm statistics, a batch

# PyTorch's GradScaler defaults: amp-fp16 scales the loss the same way in every framework
_SCALE_INIT, _SCALE_GROWTH, _SCALE_BACKOFF, _SCALE_INTERVAL = 2.0**16, 2.0, 0.5, 2000


def make_optimizer(name: str, lr: float, settings: dict[str, float] | None = None, warmup_steps: int = 0
                   ) -> optax.GradientTransformation:
    """The same optimizers and settings as the PyTorch backend (``Config.optimizer_settings()``;
    the defaults of ``options.OPTIMIZER_SETTINGS`` where None). Optax's Adam adds epsilon after
    the bias correction, as PyTorch does; its AdamW decays the weights by ``lr * weight_decay``,
    as PyTorch's does; its SGD momentum is PyTorch's, without dampening (momentum 0: plain SGD).
    ``warmup_steps``: update k (from 0) at lr x (k + 1) / warmup_steps, then lr, as PyTorch's."""
    s = {**OPTIMIZER_SETTINGS.get(name, {}), **(settings or {})}
    rate: float | optax.Schedule = lr
    if warmup_steps > 0:
        rate = lambda count: lr * jnp.minimum(1.0, (count + 1) / warmup_steps)  # noqa: E731
    if name == "adam":
        return optax.adam(rate, b1=s["beta1"], b2=s["beta2"], eps=s["eps"])
    if name == "adamw":
        return optax.adamw(rate, b1=s["beta1"], b2=s["beta2"], eps=s["eps"], weight_decay=s["weight_decay"])
    if name == "sgd":
        return optax.sgd(rate, momentum=s["momentum"] or None)
    raise ValueError(f"unknown optimizer {name!r}")


def devices_for(config: Config) -> list[jax.Device]:
    """The JAX devices a config trains on: ``dp:N``, ``fsdp:N`` and ``tp:N`` the first N of its kind, else one."""
    kind, n = config.parallel.kind, config.parallel.n
    platform = "gpu" if device_kind(config.device) == "cuda" else "cpu"
    found = jax.devices(platform)
    if kind in ("dp", "fsdp", "tp"):
        if len(found) < n:
            raise RuntimeError(f"{config.parallelism} needs {n} {platform} devices; JAX sees {len(found)}")
        return list(found[:n])
    index = device_index(config.device)
    if index >= len(found):
        raise RuntimeError(f"{config.device} requested; JAX sees {len(found)} {platform} device(s)")
    return [found[index]]


def _step_function(model: JaxModel, loss_fn: Callable[..., jax.Array], optimizer: optax.GradientTransformation,
                   policy: Policy, accum: int,
                   scaled: bool, n: int, remat: bool, fed: bool) -> Callable[..., tuple[dict[str, Any], jax.Array]]:
    """The training step jax.jit compiles: ``accum`` micro-batches (from the device-resident
    batches, the step's index picking them, or ``fed`` from the host), one optimizer update from
    their mean loss, with GradScaler's rule where ``scaled``."""
    def update(carry: dict[str, Any], micro: list[tuple[Arrays, Arrays]]) -> tuple[dict[str, Any], jax.Array]:
        """One optimizer update from the mean loss over ``micro`` (gradients summed)."""
        params, bn, count, scale = carry["params"], carry["bn"], carry["count"], carry["scale"]
        total, grads = jnp.zeros((), jnp.float32), None
        for k, (x, y) in enumerate(micro):  # unrolled: accum is small and fixed
            key = jax.random.fold_in(carry["key"], count + k)

            def scaled_loss(p: Arrays, bn: Arrays = bn, x: Arrays = x, y: Arrays = y, key: jax.Array = key
                            ) -> tuple[jax.Array, tuple[jax.Array, Arrays]]:
                out, new_bn = model.apply(p, bn, x, True, policy, key, remat)
                loss = loss_fn(out, y)
                return loss * scale / len(micro), (loss, new_bn)

            (_, (loss, bn)), g = jax.value_and_grad(scaled_loss, has_aux=True)(params)
            grads = g if grads is None else jax.tree_util.tree_map(jnp.add, grads, g)
            total = total + loss / len(micro)
        grads = jax.tree_util.tree_map(lambda g: g / scale, grads)
        updates, opt = optimizer.update(grads, carry["opt"], params)
        new_params = optax.apply_updates(params, updates)
        out = {**carry, "params": new_params, "opt": opt, "bn": bn, "count": count + len(micro)}
        if scaled:  # GradScaler's rule: skip a step with non-finite gradients and halve the scale
            ok = jnp.all(jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree_util.tree_leaves(grads)]))
            keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, old)  # noqa: E731
            good = jnp.where(ok, carry["good"] + 1, 0)
            grow = good >= _SCALE_INTERVAL
            # (the running statistics keep the forward's update, as with GradScaler, which
            # skips only optimizer.step())
            out.update(params=keep(new_params, params), opt=keep(opt, carry["opt"]),
                       scale=jnp.where(ok, jnp.where(grow, scale * _SCALE_GROWTH, scale), scale * _SCALE_BACKOFF),
                       good=jnp.where(grow, 0, good))
        return out, total

    def device_step(carry: dict[str, Any], xs: Arrays, ys: Arrays) -> tuple[dict[str, Any], jax.Array]:
        micro = []
        for k in range(accum):
            i = (carry["count"] + k) % n
            pick = lambda a, i=i: jax.lax.dynamic_index_in_dim(a, i, keepdims=False)  # noqa: E731
            micro.append((tree_map(pick, xs), tree_map(pick, ys)))
        return update(carry, micro)

    def fed_step(carry: dict[str, Any], xs: Arrays, ys: Arrays) -> tuple[dict[str, Any], jax.Array]:
        def micro(k: int) -> tuple[Arrays, Arrays]:
            return tree_map(lambda a: a[k], xs), tree_map(lambda a: a[k], ys)
        return update(carry, [micro(k) for k in range(accum)])
    return fed_step if fed else device_step


# tp:N: the arrays of a transformer block (gpubench.backends.jax.model._block) it splits, by their
# place in the block's twelve, with the projection each belongs to and the axis split: the first
# projections column-wise (their outputs: dimension 0 of a (out, in) kernel, and the bias), the
# second ones row-wise (their inputs: dimension 1; the bias is added after the all-reduce, whole)
TP_ARRAYS: dict[int, tuple[str, P]] = {2: ("qkv", P("model", None)), 3: ("qkv", P("model")),
                                       4: ("proj", P(None, "model")),
                                       8: ("fc1", P("model", None)), 9: ("fc1", P("model")),
                                       10: ("fc2", P(None, "model"))}
TP_SPLIT = {i: name for i, (name, _) in TP_ARRAYS.items()}


def tensor_shardings(spec: WorkloadSpec, params: Any, replicated: NamedSharding) -> Any:
    """Where each parameter lives under ``tp:N``: a transformer block's split arrays (TP_ARRAYS)
    on the mesh's "model" axis, everything else replicated."""
    return [[NamedSharding(replicated.mesh, TP_ARRAYS[i][1]) if isinstance(layer, TransformerBlock) and i in TP_ARRAYS
             else replicated for i, _ in enumerate(arrays)]
            for layer, arrays in zip(spec.layers, params, strict=True)]


class JaxTrainer(Trainer):
    def __init__(self, native: NativeModel | WorkloadSpec, config: Config, batches: Batches) -> None:
        if isinstance(native, WorkloadSpec):  # a built-in's spec, as the identity tests build one
            spec = native
            native = spec_native(spec, config, lambda: spec_model(spec, config.init_seed, config.attention,
                                                                     config.tensor_parallel))
        remat = config.checkpointing == "activations"
        if native.spec is None and (remat or config.precision.startswith("amp")):  # (refused before it runs)
            raise Unsupported(f"{config.precision} / checkpointing = {config.checkpointing}: for the built-in "
                              "workloads only")
        self.config = config
        kind = config.parallel.kind
        self.sharded = kind == "fsdp" and config.devices > 1
        self.tensor = kind == "tp" and config.devices > 1
        self.spec = native.spec
        # (the backend refuses it before a worker starts)
        if self.tensor and (native.spec is None or not native.spec.transformer_blocks()):
            raise Unsupported(f"{config.parallelism} splits the projections of gpubench's transformer blocks; "
                              f"{config.workload} has none")
        self.gpu = device_kind(config.device) == "cuda"
        self.devices = devices_for(config)
        self.policy = policy_for(config.precision)
        self.scaled = config.precision == "amp-fp16"
        self.accum = config.accum_steps
        self.pipeline = config.data == "pipeline"
        self.optimizer = make_optimizer(config.optimizer, config.lr, config.optimizer_settings(),
                                        config.lr_warmup_steps)
        model: JaxModel = native.build()
        loss_fn = native.loss or cross_entropy

        # placement: one device, or a mesh whose "data" axis splits every global batch (tp:N: whose
        # "model" axis splits the blocks' projections, every device taking the whole batch)
        replicated: jax.sharding.Sharding
        by_batch: jax.sharding.Sharding
        if len(self.devices) > 1:
            mesh = Mesh(np.array(self.devices), ("model",) if self.tensor else ("data",))
            replicated = NamedSharding(mesh, P())
            # (batches, samples, ...): split the samples
            by_batch = replicated if self.tensor else NamedSharding(mesh, P(None, "data"))
        else:
            replicated = by_batch = jax.sharding.SingleDeviceSharding(self.devices[0])
        self._by_batch = by_batch

        carry = {"params": model.params, "opt": self.optimizer.init(model.params), "bn": model.state,
                 "count": jnp.zeros((), jnp.int32), "key": jax.random.key(config.init_seed),
                 "scale": jnp.asarray(_SCALE_INIT if self.scaled else 1.0, jnp.float32),
                 "good": jnp.zeros((), jnp.int32)}
        self._carry = carry
        self.n_batches = batches.n_batches
        if self.pipeline:  # host batches, each step's put on the device one step ahead
            self._host_x, self._host_y = batches.x, batches.y
            self._next_index = 0
            self._ahead = self._put_next()
        else:
            # from the host straight to its shards
            self.x = jax.device_put(tree_map(np.asarray, batches.x), by_batch)
            self.y = jax.device_put(tree_map(np.asarray, batches.y), by_batch)

        step = _step_function(model, loss_fn, self.optimizer, self.policy, self.accum, self.scaled, self.n_batches,
                              remat, self.pipeline)
        carry_sharding = self._carry_sharding(replicated)
        self._carry = jax.device_put(self._carry, carry_sharding)
        self._step = jax.jit(step, donate_argnums=0,
                             in_shardings=(carry_sharding, by_batch, by_batch),
                             out_shardings=(carry_sharding, replicated))
        self._losses: list[jax.Array] = []  # every unread step's loss, on the device
        self._info = self._runtime(remat)
        policy = self.policy

        def eval_loss(params: Arrays, bn: Arrays, x: Arrays, y: jax.Array) -> jax.Array:
            def one(xy: tuple[Arrays, jax.Array]) -> jax.Array:
                out, _ = model.apply(params, bn, xy[0], False, policy, None, False)
                return jnp.asarray(loss_fn(out, xy[1]), jnp.float32)

            return jnp.mean(jax.lax.map(one, (x, y)))

        self._eval = jax.jit(eval_loss)
        self._replicated = replicated

    def _carry_sharding(self, replicated: jax.sharding.Sharding) -> Any:
        """Where each array of the training state lives: replicated on every device, or with
        ``fsdp:N`` the parameters and the optimizer's state split on the mesh's "data" axis
        (each array along its first dimension that N divides; one N divides nowhere stays
        whole on every device), so that each device holds 1/N of them. XLA gathers a layer's
        parameters where the step needs them and reduce-scatters the gradients."""
        if self.tensor:
            assert isinstance(replicated, NamedSharding) and self.spec is not None  # (tensor_unsupported)
            params = tensor_shardings(self.spec, self._carry["params"], replicated)
            return {**jax.tree_util.tree_map(lambda _: replicated, self._carry), "params": params,
                    "opt": optax.tree_map_params(self.optimizer, lambda _, s: s, self._carry["opt"], params,
                                                 transform_non_params=lambda _: replicated)}
        if not self.sharded:
            return jax.tree_util.tree_map(lambda _: replicated, self._carry)
        assert isinstance(replicated, NamedSharding)  # a mesh: fsdp:N has N > 1 devices
        n = len(self.devices)

        def split(a: Any) -> jax.sharding.Sharding:
            dim = next((i for i, size in enumerate(np.shape(a)) if size % n == 0 and size >= n), None)
            if dim is None:
                return replicated
            return NamedSharding(replicated.mesh, P(*([None] * dim), "data"))

        return {k: (jax.tree_util.tree_map(split, v) if k in ("params", "opt")
                    else jax.tree_util.tree_map(lambda _: replicated, v)) for k, v in self._carry.items()}

    def state_bytes(self) -> dict[str, int]:
        """The parameters and optimizer state on the first device (gradients live only inside
        the compiled step)."""
        def on_first(tree: Any) -> int:
            return sum(int(shard.data.nbytes) for a in jax.tree_util.tree_leaves(tree)
                       if hasattr(a, "addressable_shards")
                       for shard in a.addressable_shards if shard.device == self.devices[0])

        return {"params_bytes": on_first(self._carry["params"]), "optimizer_bytes": on_first(self._carry["opt"])}

    def _runtime(self, remat: bool) -> dict[str, Any]:
        """How the step was set up (the result's ``runtime``)."""
        held = ("the parameters and optimizer state split on the same axis (1/N on each device); XLA inserts the "
                "all-gathers of the parameters and the reduce-scatter of the gradients" if self.sharded else
                "the parameters replicated; XLA inserts the gradient all-reduce")
        distributed = (f"jax.jit over a Mesh of {len(self.devices)} devices: each global batch split on its "
                       f"'data' axis, {held} (batch-norm statistics are over the global batch)"
                       ) if len(self.devices) > 1 else None
        if self.tensor:
            distributed = (f"jax.jit over a Mesh of {len(self.devices)} devices on its 'model' axis: each "
                           "transformer block's q, k, v and first MLP projection split column-wise, its output "
                           "and second MLP projection row-wise (with their optimizer state; the rest replicated), "
                           "every device on the whole batch; XLA inserts the all-reduces")
        return {
            "optimizer_impl": "optax",
            "compute_dtype": jnp.dtype(self.policy.compute).name,
            "matmul_precision": str(self.policy.precision).rsplit(".", 1)[-1],
            "loss_scale": "dynamic (GradScaler's rule)" if self.scaled else None,
            "tf32": self.config.precision == "tf32",
            "compile": {"setting": self.config.compile,
                        "how": "jax.jit: the whole step one XLA program; its compilation is in the cold start"},
            "step_timing": "window_mean",
            "grad_accum": self.accum,
            "checkpointing": "jax.checkpoint around each top-level layer with parameters" if remat else "none",
            "distributed": distributed,
            **({"sharding": {"tp": {"blocks": len(self.spec.transformer_blocks()), "plan": ["gpubench"],
                                    "split": sorted(set(TP_SPLIT.values()))}}}
               if self.tensor and self.spec is not None else {}),
            "data": "host arrays, device_put one step ahead" if self.pipeline else "device-resident",
            "devices": [str(d) for d in self.devices],
            # JAX cannot reset its allocator's peak: it is the worker's, building included
            "memory_peak": "since the worker started" if self.gpu else None,
        }

    # --- data ------------------------------------------------------------------------------

    def _put_next(self) -> tuple[jax.Array, jax.Array]:
        """The micro-batches of the next step, put on the device(s) (asynchronously)."""
        idx = [(self._next_index + k) % self.n_batches for k in range(self.accum)]
        self._next_index = (self._next_index + self.accum) % self.n_batches
        x = tree_map(lambda a: np.stack([a[i] for i in idx]), self._host_x)
        y = tree_map(lambda a: np.stack([a[i] for i in idx]), self._host_y)
        return jax.device_put(x, self._by_batch), jax.device_put(y, self._by_batch)

    # --- the Trainer interface -------------------------------------------------------------

    def step(self) -> None:
        if self.pipeline:
            xs, ys = self._ahead
            self._carry, loss = self._step(self._carry, xs, ys)
            self._ahead = self._put_next()
        else:
            self._carry, loss = self._step(self._carry, self.x, self.y)
        self._losses.append(loss)

    def sync(self) -> None:
        jax.block_until_ready(self._carry)

    def evaluate(self, batches: Batches) -> float:
        """The mean loss over held-out ``batches`` (inference mode: no dropout, batch norm's
        running statistics), every device computing all of them."""
        x, y = (jax.device_put(tree_map(np.asarray, t), self._replicated) for t in (batches.x, batches.y))
        return float(self._eval(self._carry["params"], self._carry["bn"], x, y))

    def read_losses(self) -> list[float]:
        losses, self._losses = self._losses, []
        return np.asarray(jax.device_get(losses), dtype=np.float64).reshape(-1).tolist()

    def step_timer(self, n_steps: int) -> StepTimer:
        # JAX dispatches asynchronously on every device (the CPU too) and has no device events:
        # a window is timed on the host clock up to its synchronisation, one mean per window
        return WindowTimer(n_steps)

    def memory(self) -> dict[str, int]:
        if not self.gpu:
            return {}
        stats = self.devices[0].memory_stats() or {}
        return {"peak_allocated_bytes": int(stats["peak_bytes_in_use"])} if "peak_bytes_in_use" in stats else {}

    def describe(self) -> dict[str, Any]:
        return dict(self._info)

    def compile_events(self) -> int | None:
        # the jitted step's cache: one entry per compilation (a retrace would add one)
        size = getattr(self._step, "_cache_size", None)
        return int(size()) if callable(size) else None

    def weights_digest(self) -> str | None:
        h = hashlib.sha1()
        for a in jax.tree_util.tree_leaves(self._carry["params"]):
            h.update(np.asarray(a, dtype=np.float32).tobytes())
        return h.hexdigest()

    def phased_step(self, lap: Lap) -> None:
        raise ProfilingUnavailable("JAX compiles the whole step (forward, backward, update) into one XLA program: "
                                   "its phases cannot be timed apart; the operator tables say where its time goes")

    def profile(self, steps: int, out_dir: Path) -> dict[str, Any]:
        from gpubench.backends.jax.profiling import profile_steps

        return profile_steps(self, steps, out_dir)
