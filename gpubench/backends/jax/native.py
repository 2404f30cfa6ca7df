"""The JAX backend's models: a built-in workload's spec, or the user's factory of a Flax module.

A factory (``workload = "mymodels:make"``) returns a ``flax.linen.Module``; gpubench initialises
it on one batch of the config's data (``input_shape`` is required: a Flax module declares no
input), trains its ``params`` collection and carries its other collections (``batch_stats``...)
as state. A module whose ``__call__`` takes ``train``, ``training`` or ``deterministic`` is told
which pass it is in. FLOPs are XLA's cost analysis of one compiled training step (every op:
matrix multiplies and convolutions as 2 per multiply-add, and the elementwise ops as well).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from gpubench.backends.base import NativeModel, Tree, Unsupported, spec_native
from gpubench.backends.jax.model import JaxModel, Policy, cross_entropy, logits_of, spec_model
from gpubench.config import Config
from gpubench.workloads import WORKLOADS
from gpubench.workloads.data import SyntheticTask, tree_map
from gpubench.workloads.dataset import builtin_spec
from gpubench.workloads.source import (
    CHOICES,
    FIRST_BATCH,
    SourceError,
    check_arguments,
    check_first_batch,
    code_origin,
    config_loss,
    counted_once,
    describe,
    import_function,
    input_problem,
    own_batches,
    parse_workload,
    probe_scores,
    recomputed_once,
    token_task,
)

if TYPE_CHECKING:
    import flax.linen as nn

FLOP_COUNT_BATCH = FIRST_BATCH  # the first batch's samples (own_batches), counted and checked
_TRAIN_FLAGS = {"train": True, "training": True, "deterministic": False}  # the value in a training pass
Loss = Callable[[Any, Any], Any]  # a user's loss(outputs, targets), as config_loss gives it


def call_args(x: Tree[jax.Array]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A batch's inputs as a module takes them: one array, several (a tuple), keywords (a dict)."""
    if isinstance(x, dict):
        return (), dict(x)
    if isinstance(x, (tuple, list)):
        return tuple(x), {}
    return (x,), {}


def flax_model(module: nn.Module, sample: Tree[np.ndarray], seed: int) -> JaxModel:
    """A Flax linen module, initialised on ``sample`` (a batch of its inputs)."""
    params_of = inspect.signature(type(module).__call__).parameters
    flag = next((name for name in _TRAIN_FLAGS if name in params_of), None)

    def flags(train: bool) -> dict[str, Any]:
        return {} if flag is None else {flag: train if flag != "deterministic" else not train}

    args, kwargs = call_args(tree_map(jnp.asarray, sample))
    key = jax.random.key(seed)
    variables = module.init({"params": key, "dropout": jax.random.fold_in(key, 1)}, *args, **kwargs, **flags(False))
    params = variables["params"]
    state = {k: v for k, v in variables.items() if k != "params"}

    def apply(params: Mapping[str, Any], state: dict[str, Mapping[str, Any]], x: Tree[jax.Array], train: bool,
              policy: Policy | None, key: jax.Array | None, remat: bool) -> tuple[object, Tree[jax.Array]]:
        args, kwargs = call_args(x)
        rngs = {"dropout": key} if key is not None else {}
        if train and state:
            out, new_state = module.apply({"params": params, **state}, *args, **kwargs, **flags(True), rngs=rngs,
                                          mutable=list(state))
            return out, dict(new_state)
        return module.apply({"params": params, **state}, *args, **kwargs, **flags(train), rngs=rngs), state

    return JaxModel(params, state, apply)


def native_model(config: Config, counts: Path | None = None, count: bool = True) -> NativeModel:
    """The config's model, its data and its facts; ``counts``: the run's FLOP counts (counted_once;
    none with ``count`` False)."""
    ref = parse_workload(config.workload, sorted(WORKLOADS))
    if ref.kind == "builtin":
        spec = builtin_spec(config)
        native = spec_native(spec, config, lambda: spec_model(spec, config.init_seed, config.attention,
                                                                     config.tensor_parallel))
        if count:
            def recomputed() -> dict[str, Any]:
                x, y = native.make_batches(FLOP_COUNT_BATCH, 1).sample(FLOP_COUNT_BATCH)
                return recomputed_flops(native.build(), x, y)
            recomputed_once(counts, config, native.facts, jax.__version__, recomputed)
        return native
    if ref.kind != "factory":  # (the backend refuses a zoo's name before this)
        raise Unsupported(f"the jax backend takes a factory of a Flax module, not {config.workload}")
    import flax.linen as nn

    fn = import_function(config.workload, "workload")
    kwargs = dict(config.workload_params)
    check_arguments(fn, kwargs, config.workload)
    module = fn(**kwargs)
    if not isinstance(module, nn.Module):
        raise SourceError(f"workload {config.workload!r}: the factory returned {type(module).__name__}, not a "
                          "flax.linen.Module (framework = jax)")
    loss = config_loss(config)
    batch_fn = import_function(config.batches, "batches") if config.batches else None
    task: SyntheticTask | None = None
    notes: list[str] = []
    if batch_fn is None and config.dataset == "synthetic":
        if not config.input_shape:
            raise SourceError(f"workload {config.workload!r}: a Flax module declares no input; give input_shape "
                              "(one sample, in the module's own layout: [32, 32, 3] for an NHWC image model)")
        # a module declares no layers before it is initialised: tokens only where the suite says
        task = (_token_task(module, config, notes) if config.input_kind == "tokens" else None) or SyntheticTask(
            tuple(config.input_shape), config.num_classes or 0)
    facts: dict[str, Any] = {"source": "factory", "identical": False, "origin": code_origin(fn)}
    # the classes unknown: initialised on a task of 2, then read from the module's output
    first = task if task is None or task.num_classes else SyntheticTask(task.input_shape, 2)
    data: dict[str, Any] = {}
    make, sample, held_out = own_batches(first, batch_fn, config, facts, data)
    x, y = sample.sample(FLOP_COUNT_BATCH)
    try:
        model = flax_model(module, x, config.seed)
        out = model.infer(x)
    except Exception as e:  # noqa: BLE001 - the user's module and the data do not fit: say so in one line
        raise input_problem(config, first, e) from None
    facts["params"] = int(sum(np.prod(a.shape) for a in jax.tree_util.tree_leaves(model.params)))
    if task is not None:
        if not task.num_classes:
            try:
                task = SyntheticTask(task.input_shape, int(np.shape(logits_of(out))[-1]), task.kind)
            except (TypeError, IndexError):  # no scores, or a scalar first
                raise SourceError(f"workload {config.workload!r}: the module returned {describe(out)}, which holds "
                                  f"no scores; set num_classes, or use {CHOICES}") from None
            make, sample, held_out = own_batches(task, None, config)
            x, y = sample.sample(FLOP_COUNT_BATCH)
        facts.update(input_shape=list(task.input_shape), num_classes=task.num_classes, task=task.kind)
    _check_first_batch(model, x, y, loss, config, task)
    if notes:
        facts["notes"] = notes
    if count:
        facts.update(counted_once(counts, config, facts, jax.__version__, lambda: train_flops(model, x, y, loss)))
    # a fresh initialisation per build, not the probe's arrays: the trainer donates its parameters
    return NativeModel(build=lambda: flax_model(module, x, config.init_seed), make_batches=make, facts=facts, loss=loss,
                       eval_batches=held_out, data=data)


def _token_task(module: nn.Module, config: Config, notes: list[str]) -> SyntheticTask | None:
    """``input_kind = "tokens"``: the module initialised on 2 sequences of token ids
    (``probe_scores``); its scores' shape and its first embedding's rows (the first ``nn.Embed``
    it made) decide the task."""
    shape = tuple(config.input_shape)
    made: list[JaxModel] = []

    def run(inputs: Tree[np.ndarray]) -> object:
        made[:] = [flax_model(module, inputs, config.seed)]
        return made[0].infer(inputs)

    found = probe_scores(config, np.zeros((FLOP_COUNT_BATCH, *shape), np.int32), True, run, _scores_of) if len(
        shape) == 1 else None
    scores = None if isinstance(found, BaseException) else found  # (none: no token ids; the first batch says why)
    vocab = _first_embedding_rows(made[0].params) if made and not isinstance(found, BaseException) else None
    return token_task(config, shape, vocab, "nn.Embed", scores, notes)


def _first_embedding_rows(params: Tree[jax.Array]) -> int | None:
    """The rows of the first ``embedding`` table in the order the module made its parameters (a
    dict's own order: jax's tree functions sort the names)."""
    if hasattr(params, "items"):
        for name, value in params.items():
            if name == "embedding" and hasattr(value, "shape"):
                return int(value.shape[0])
            found = _first_embedding_rows(value)
            if found is not None:
                return found
    return None


def _check_first_batch(model: JaxModel, x: Tree[np.ndarray], y: Tree[np.ndarray], loss: Loss | None, config: Config,
                       task: SyntheticTask | None) -> None:
    """The module on a batch of 2 of what it trains on, before any config trains: it takes the
    inputs, and its loss (cross-entropy, the user's, the module's own) is one finite number
    (``check_first_batch``)."""
    targets = tree_map(jnp.asarray, y)
    check_first_batch(config, task, lambda: model.infer(x), _scores_of,
                      lambda out: (loss or cross_entropy)(out, targets), loss is not None,
                      tuple(y.shape) if isinstance(y, np.ndarray) else None)


def _scores_of(out: object) -> tuple[int, ...] | None:
    """The shape of the scores in a module's output (``logits_of``), or None where it holds none
    (a scalar first holds none)."""
    try:
        return tuple(np.shape(logits_of(out))) or None
    except TypeError:
        return None


def matrix_flops(jaxpr: Any) -> int:
    """2 x output elements x contracted size of every ``dot_general`` and convolution in a jaxpr
    and the jaxprs inside it: the matrix work a built-in spec counts, as JAX traced it."""
    from jax.extend.core import jaxprs_in_params

    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in lhs_contract)
        elif eqn.primitive.name == "conv_general_dilated":
            kernel = eqn.invars[1].aval.shape
            spec = eqn.params["dimension_numbers"].rhs_spec  # (out, in, spatial...) positions
            total += (2 * math.prod(eqn.outvars[0].aval.shape) * kernel[spec[1]]
                      * math.prod(kernel[d] for d in spec[2:]))
        for sub in jaxprs_in_params(eqn.params):
            total += matrix_flops(sub)
    return total


def recomputed_flops(model: JaxModel, x: Tree[np.ndarray], y: np.ndarray) -> dict[str, Any]:
    """``recomputed_flops_per_sample``: the matrix FLOPs of the traced training step (forward,
    loss, gradients) with ``jax.checkpoint`` around the layers less those without, at batch
    FLOP_COUNT_BATCH: the forward the backward pass computes again (JAX leaves out what no
    gradient needs, such as a block's last product). Traced, not compiled or run."""
    def grads(remat: bool) -> int:
        def objective(p: Tree[jax.Array]) -> jax.Array:
            out, _ = model.apply(p, model.state, tree_map(jnp.asarray, x), True, None, jax.random.key(0), remat)
            return cross_entropy(out, jnp.asarray(y))
        return matrix_flops(jax.make_jaxpr(jax.grad(objective))(model.params).jaxpr)

    try:
        extra = grads(True) - grads(False)
    except Exception:  # noqa: BLE001 - no figure: the result has no hardware FLOPs, and MFU stands
        return {"recomputed_flops_per_sample": None}
    return {"recomputed_flops_per_sample": extra // FLOP_COUNT_BATCH if extra >= 0 else None}


def train_flops(model: JaxModel, x: Tree[np.ndarray], y: np.ndarray, loss: Loss | None) -> dict[str, Any]:
    """FLOPs per sample of one training step (forward, loss and backward), by XLA's cost analysis
    of the compiled step at batch FLOP_COUNT_BATCH."""
    loss_fn = loss or cross_entropy

    def step(params: Tree[jax.Array], x: Tree[jax.Array], y: jax.Array) -> Tree[jax.Array]:
        def objective(p: Tree[jax.Array]) -> jax.Array:
            out, _ = model.apply(p, model.state, x, True, None, jax.random.key(0), False)
            return loss_fn(out, y)
        return jax.grad(objective)(params)

    try:
        cost: Any = jax.jit(step).lower(model.params, tree_map(jnp.asarray, x), jnp.asarray(y)).compile()
        analysis = cost.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, list) else analysis
        flops = float(analysis["flops"]) / FLOP_COUNT_BATCH
    except Exception as e:  # noqa: BLE001 - no count: the result says why and shows no MFU
        return {"flops_per_sample": None, "flops_note": f"XLA's cost analysis failed: {type(e).__name__}: {e}"}
    if not flops > 0:
        return {"flops_per_sample": None, "flops_note": "XLA's cost analysis gave no FLOPs for the step"}
    return {"flops_per_sample": int(flops), "flops_counted_by": "XLA's cost analysis of the compiled training step "
                                                                "(every op, elementwise ones included)"}
