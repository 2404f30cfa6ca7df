"""Sharded data parallelism (``fsdp:N``), tensor parallelism (``tp:N``) and the two on a 2-D
mesh (``fsdp:A+tp:B``, ``apply``) for PyTorch.

``fsdp:N`` is FSDP2: ``fully_shard`` on each of the model's blocks and then on the root, so
that each rank holds 1/N of every parameter (dimension 0), its gradient and its optimizer
state, gathers a block's parameters just before the block runs and frees them after it
(``fsdp_reshard``), and reduce-scatters the gradients. The blocks are found by shape, not by
name (``blocks``): the children of every ``nn.Sequential`` or ``nn.ModuleList`` on the way
down from the root (a built-in workload's layers, a residual stage's blocks, nanoGPT's
``transformer.h``, a Hugging Face decoder's ``model.layers``); a block that shares a parameter
with another module (a tied embedding and output head) stays with the root.

``tp:N`` splits a transformer's projections in the Megatron-LM way (DTensor's
``parallelize_module``): the first projection of attention (q, k, v) and of the MLP column-
wise, the second row-wise, so that each block needs one all-reduce in its forward and one in
its backward, and every rank computes a slice of the heads and of the MLP's hidden units for
the whole batch. Everything else (embeddings, norms, the head) is replicated. The projections
are known by name (``TP_PLANS``): gpubench's own transformer block, and the Llama family's
(``q_proj``/``k_proj``/``v_proj``/``o_proj``, ``gate_proj``/``up_proj``/``down_proj``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from gpubench.backends.base import Unsupported
from gpubench.backends.pytorch.model import Block
from gpubench.options import COMPOSITE_KINDS
from gpubench.workloads.base import TransformerBlock

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from gpubench.config import Config

# the projections tensor parallelism splits, by the attribute names of a block's linear layers:
# column-wise (the output features split: q, k, v and the MLP's first) and row-wise (the input
# features split, the outputs summed: attention's output projection and the MLP's second)
TP_PLANS: dict[str, dict[str, str]] = {
    "gpubench": {"qkv": "colwise", "proj": "rowwise", "fc1": "colwise", "fc2": "rowwise"},
    "llama": {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
              "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
              "mlp.down_proj": "rowwise"},
}
CONTAINERS = (nn.Sequential, nn.ModuleList)


def _has_params(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _candidates(module: nn.Module) -> Iterator[nn.Module]:
    """The children of every container on the way down from ``module``: a container's
    children with parameters are blocks (not searched further); another module's children are
    searched."""
    for child in module.children():
        if isinstance(module, CONTAINERS):
            if _has_params(child):
                yield child
        else:
            yield from _candidates(child)


def _registrations(module: nn.Module) -> dict[int, int]:
    """How many times each parameter of ``module`` is registered in it (a tied one: more than once)."""
    counts: dict[int, int] = {}
    for _, p in module.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    return counts


def blocks(model: nn.Module) -> list[nn.Module]:
    """The modules ``fully_shard`` wraps one by one, in forward order (see the module's
    docstring); a block holding a parameter that another module also holds (weight tying) is
    left to the root."""
    found = list(_candidates(model))
    whole = _registrations(model)
    return [b for b in found if all(whole[i] == n for i, n in _registrations(b).items())]


def apply(model: nn.Module, config: Config, device: torch.device, world: int,
          param_dtype: torch.dtype | None) -> dict[str, Any]:
    """The model split on each axis of its parallelism; returns what the result's runtime says
    of each. ``fsdp:N`` and ``tp:N`` split over a mesh of every rank; ``fsdp:A+tp:B`` over a
    2-D mesh of ``world // B`` rows of B consecutive ranks (one node's): tensor parallel along
    a row first, then ``fully_shard`` shards the split parameters again across the rows, as
    torchtitan's 2-D does."""
    from torch.distributed.device_mesh import init_device_mesh

    kind = config.parallel.kind
    if kind in COMPOSITE_KINDS:
        tensor = config.tensor_parallel
        grid = init_device_mesh(device.type, (world // tensor, tensor), mesh_dim_names=COMPOSITE_KINDS[kind])
        axes = {"tp": grid["tp"], "fsdp": grid["fsdp"]}
    else:
        axes = {kind: init_device_mesh(device.type, (world,))}
    info: dict[str, Any] = {}
    if "tp" in axes:
        info["tp"] = apply_tp(model, config, axes["tp"])
    if "fsdp" in axes:
        info["fsdp"] = apply_fsdp(model, config, axes["fsdp"], param_dtype)
    return info


def apply_fsdp(model: nn.Module, config: Config, device_mesh: DeviceMesh,
               param_dtype: torch.dtype | None) -> dict[str, Any]:
    """``fully_shard`` on every block, then on the root; returns what the result's runtime
    says of it. Parameters are held in float32 and gathered in ``param_dtype`` (a mixed
    precision's), gradients reduced in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    found = blocks(model)
    if not found:
        raise Unsupported(f"fsdp:N shards each block of a model on its own; {config.workload} has none: no "
                          "nn.Sequential or nn.ModuleList of modules with parameters (use ddp:N)")
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    reshard = config.fsdp_reshard == "after-forward"
    types = sorted({type(b).__name__ for b in found})  # before fully_shard renames their classes
    for module in (*found, model):  # the blocks, then the root (what no block holds)
        fully_shard(module, mesh=device_mesh, reshard_after_forward=reshard, mp_policy=policy)
    return {"blocks": len(found), "block_types": types,
            "reshard_after_forward": reshard,
            "param_dtype": str(param_dtype or torch.float32).removeprefix("torch."), "reduce_dtype": "float32"}


def _plan_of(block: nn.Module) -> str | None:
    """The name of the TP plan whose projections ``block`` has, or None."""
    names = {name for name, m in block.named_modules() if isinstance(m, nn.Linear)}
    return next((name for name, plan in TP_PLANS.items() if set(plan) <= names), None)


def _interleave_qkv(block: Block, n: int) -> None:
    """Reorder the rows of a fused q, k, v projection into n chunks of whole heads
    (TransformerBlock.qkv_row_order): a column-wise split then gives rank r its heads' q, k and v
    (the losses do not change: the rows are only permuted, before the optimizer exists, and the
    attention reads q, k and v by their heads)."""
    order = torch.from_numpy(TransformerBlock.qkv_row_order(block.qkv.in_features, n))
    with torch.no_grad():
        block.qkv.weight.copy_(block.qkv.weight[order])
        block.qkv.bias.copy_(block.qkv.bias[order])


def _heads(block: nn.Module) -> int | None:
    """The fewest heads of a block's attention projections (a Llama block's key-value heads may be
    fewer than its query heads): each rank takes an equal share of each."""
    if isinstance(block, Block):
        return block.heads
    attention = getattr(block, "self_attn", None)
    head_dim = getattr(attention, "head_dim", None)
    if attention is None or not isinstance(head_dim, int):
        return None
    return min(attention.get_submodule(name).out_features // head_dim for name in ("q_proj", "k_proj", "v_proj"))


def apply_tp(model: nn.Module, config: Config, device_mesh: DeviceMesh) -> dict[str, Any]:
    """Split every transformer block's projections over the ranks of ``device_mesh`` (see the
    module's docstring); returns what the result's runtime says of it."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    world = device_mesh.size()
    found = [(b, plan) for b in model.modules() if (plan := _plan_of(b)) is not None]
    if not found:
        known = "; ".join(f"{k}: {', '.join(p)}" for k, p in TP_PLANS.items())
        raise Unsupported(f"tp:N splits a transformer's attention and MLP projections; {config.workload} has no "
                          f"block with projections gpubench knows by name ({known}); use fsdp:N or ddp:N")
    for block, plan in found:
        for name in TP_PLANS[plan]:
            linear = block.get_submodule(name)
            assert isinstance(linear, nn.Linear)
            if linear.out_features % world or linear.in_features % world:
                raise Unsupported(f"tp:{world} splits {type(block).__name__}.{name} ({linear.in_features} -> "
                                  f"{linear.out_features} features) into {world} equal slices; {world} does not "
                                  "divide them")
        heads = _heads(block)
        if heads is not None and heads % world:
            raise Unsupported(f"tp:{world} gives each rank 1/{world} of the attention heads; {type(block).__name__} "
                              f"has {heads} (query or key-value) heads, not a multiple of {world}")
        if isinstance(block, Block):
            _interleave_qkv(block, world)
    for block, plan in found:
        parallelize_module(block, device_mesh, {name: ColwiseParallel() if style == "colwise" else RowwiseParallel()
                                                for name, style in TP_PLANS[plan].items()})
    return {"blocks": len(found), "plan": sorted({plan for _, plan in found}),
            "split": sorted({name for _, plan in found for name in TP_PLANS[plan]})}


def param_groups(model: nn.Module) -> list[dict[str, Any]]:
    """The model's parameters in two groups, the split (DTensor) ones and the rest: an
    optimizer's foreach and fused kernels take one kind of tensor at a time."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    split = [p for p in params if isinstance(p, DTensor)]
    whole = [p for p in params if not isinstance(p, DTensor)]
    return [{"params": group} for group in (split, whole) if group]


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t`` (a DTensor's local shard; a plain tensor itself)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """The bytes of training state resident on this rank's device: parameters, gradients
    (PyTorch keeps them from one step to the next) and the optimizer's state, each counted as
    this rank holds it (a shard of a sharded tensor)."""
    def nbytes(t: torch.Tensor) -> int:
        part = local(t)
        return int(part.numel() * part.element_size())

    params = list(model.parameters())
    opt = 0
    if optimizer is not None:
        opt = sum(nbytes(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return {"params_bytes": sum(nbytes(p) for p in params),
            "grads_bytes": sum(nbytes(p.grad) for p in params if p.grad is not None),
            "optimizer_bytes": opt}
