"""``pipeline:N``: the model split into N stages, one process (and device) per stage, with
PyTorch's own pipelining (``torch.distributed.pipelining``: PipelineStage + a schedule).

``batch_size`` is the batch of one optimizer step; every stage processes all of it, in
``pipeline_microbatches`` micro-batches. The schedule divides each stage's accumulated
gradients by the number of micro-batches (``scale_grads``) and the loss is the mean over the
micro-batches, so a step trains exactly like ``single`` at the same batch (the same losses,
step for step, where nothing random such as dropout differs) for models without batch
statistics; a model with batch norm normalises each micro-batch with its own statistics, as
gradient accumulation over those micro-batches would.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from gpubench.backends.pytorch.model import build_model
from gpubench.backends.pytorch.trainer import AutocastModule, TorchTrainerBase, make_optimizer, warmup
from gpubench.config import Config
from gpubench.workloads.base import WorkloadSpec
from gpubench.workloads.data import Batches

SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def layer_costs(spec: WorkloadSpec) -> list[int]:
    """Forward FLOPs per sample of each top-level layer (a residual block's: its leaves'; 0 for
    layers without convolutions or matrix multiplies)."""
    return [sum(leaf.forward_flops() for leaf in leaves) for leaves in spec.leaves_by_layer()]


def split_stages(costs: list[int], n: int) -> list[tuple[int, int]]:
    """Cut the layers into ``n`` contiguous, non-empty stages ``(start, end)``: the split whose
    most expensive stage costs least; among those, the most even one (smallest sum of squared
    stage costs); then the one with later cuts (a parameter-free layer stays with the layer
    before it). Dynamic programming over (stages, layers), two passes."""
    if not 1 <= n <= len(costs):
        raise ValueError(f"cannot split {len(costs)} layers into {n} stages")
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def cost(a: int, b: int) -> int:
        return prefix[b] - prefix[a]

    def best(combine: Callable[[float, int], float], limit: float) -> list[list[tuple[float, int]]]:
        # table[k][i]: (best score of the first i layers in k stages, where the last stage starts)
        table = [[(float("inf"), -1)] * (len(costs) + 1) for _ in range(n + 1)]
        table[0][0] = (0, 0)
        for k in range(1, n + 1):
            for i in range(k, len(costs) + 1):
                for j in range(k - 1, i):  # the last stage is layers j..i-1
                    prev = table[k - 1][j][0]
                    if prev == float("inf") or cost(j, i) > limit:
                        continue
                    value = combine(prev, cost(j, i))
                    if value <= table[k][i][0]:  # "<=": later cuts win ties
                        table[k][i] = (value, j)
        return table

    widest = best(max, float("inf"))[n][len(costs)][0]
    table = best(lambda prev, c: prev + c * c, widest)
    cuts, i = [], len(costs)
    for k in range(n, 0, -1):
        j = table[k][i][1]
        cuts.append((j, i))
        i = j
    return cuts[::-1]


class PipelineTrainer(TorchTrainerBase):
    def __init__(self, spec: WorkloadSpec, config: Config, batches: Batches) -> None:
        import torch.distributed.pipelining as pipelining

        self._setup(config)
        self.first, self.last = self.rank == 0, self.rank == self.world_size - 1
        costs = layer_costs(spec)
        self.stages = split_stages(costs, self.world_size)
        start, end = self.stages[self.rank]
        # every rank builds the whole model from the canonical weights and keeps its stage
        model = build_model(spec, spec.init_weights(config.init_seed), config.attention)
        self.model = model[start:end].to(self.device)
        self.model.train()
        dtype = self.autocast_dtype
        module = (AutocastModule(self.model, self.device.type, dtype, float_output=self.last)
                  if dtype is not None else self.model)
        stage = pipelining.PipelineStage(module, self.rank, self.world_size, self.device)
        schedule_class = getattr(pipelining, SCHEDULE_CLASSES[config.pipeline_schedule])
        self.schedule = schedule_class(stage, config.pipeline_microbatches, loss_fn=nn.CrossEntropyLoss(),
                                       scale_grads=True)
        self.optimizer = make_optimizer(config.optimizer, self.model.parameters(), config.lr, fused=self.cuda,
                                        settings=config.optimizer_settings(), impl=config.optimizer_impl)
        self.scheduler = warmup(self.optimizer, config.lr_warmup_steps)
        # the first stage feeds the inputs, the last one the targets
        self.n_batches = batches.n_batches
        self.x = torch.from_numpy(batches.x).to(self.device) if self.first else None
        self.y = torch.from_numpy(batches.y).to(self.device) if self.last else None
        self._i = 0
        self._losses: list[torch.Tensor] = []  # the last stage's: every unread step's loss
        self._unread = 0  # every stage's count of them
        layers = [type(m).__name__ for m in model]
        self._info.update({
            "grad_scaler": False,
            "grad_accum": 1,
            "distributed": (f"{SCHEDULE_CLASSES[config.pipeline_schedule]}({self.backend_name}, "
                            f"stages={self.world_size}, microbatches={config.pipeline_microbatches})"),
            "data": "device-resident",
            "pipeline": {
                "schedule": config.pipeline_schedule,
                "microbatches": config.pipeline_microbatches,
                "micro_batch_size": config.micro_batch_size,
                "balance": "forward FLOPs",
                "stages": [{"layers": [a, b], "modules": layers[a:b],
                            "params": sum(p.numel() for p in model[a:b].parameters()),
                            "forward_flops_per_sample": sum(costs[a:b])} for a, b in self.stages],
            },
        })
        self._ready()

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        i = self._i
        self._i = (i + 1) % self.n_batches
        args = (self.x[i],) if self.x is not None else ()  # the first stage feeds the inputs
        losses: list[torch.Tensor] = []
        kwargs = {"target": self.y[i], "losses": losses} if self.y is not None else {}  # the last, the labels
        self.schedule.step(*args, **kwargs)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        if self.last:  # the mean of the micro-batches' mean losses: the batch's mean loss
            self._losses.append(torch.stack(losses).detach().mean())
        self._unread += 1

    def read_losses(self) -> list[float]:
        """Every unread step's loss, computed on the last stage and broadcast to every rank (a
        collective: every rank reads at the same point, outside the timed region)."""
        n, self._unread = self._unread, 0
        if not n:
            return []
        import torch.distributed as dist

        losses = torch.stack(self._losses).float() if self.last else torch.zeros(n, device=self.device)
        self._losses = []
        dist.broadcast(losses, src=self.world_size - 1)
        return losses.tolist()
