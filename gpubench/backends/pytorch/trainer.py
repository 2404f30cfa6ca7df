"""The PyTorch trainer: one model, optimizer and device-resident data set."""

from __future__ import annotations

import contextlib
import hashlib
import os
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpubench.backends.base import Trainer, device_kind, parse_parallelism
from gpubench.measure.timers import HostStepTimer, StepTimer
from gpubench.suite import Config
from gpubench.workloads.base import WorkloadSpec
from gpubench.workloads.data import Batches
from gpubench.backends.pytorch.checkpointing import checkpointed
from gpubench.backends.pytorch.model import build_model

AUTOCAST_DTYPES = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}


class CudaEventTimer:
    """CUDA events recorded on the current stream between steps: step times are the GPU's
    own, and recording an event does not synchronise the host."""

    def __init__(self, n_steps: int) -> None:
        self._events = [torch.cuda.Event(enable_timing=True) for _ in range(n_steps + 1)]
        self._i = 0

    def mark(self) -> None:
        self._events[self._i].record()
        self._i += 1

    def elapsed_ms(self) -> list[float]:
        ev = self._events[: self._i]
        return [a.elapsed_time(b) for a, b in zip(ev, ev[1:])]


def make_optimizer(name: str, params: Any, lr: float, fused: bool) -> torch.optim.Optimizer:
    """adam / adamw / sgd (momentum 0.9). ``fused`` selects the single-kernel implementations
    (the fastest standard path on CUDA)."""
    kw: dict[str, Any] = {"fused": True} if fused else {}
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, **kw)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, **kw)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, **kw)
    raise ValueError(f"unknown optimizer {name!r}")


class TorchTrainer(Trainer):
    def __init__(self, spec: WorkloadSpec, config: Config, batches: Batches) -> None:
        self.cuda = device_kind(config.device) == "cuda"
        # ddp:N: one process per rank, started by torchrun, which sets RANK, WORLD_SIZE and
        # LOCAL_RANK; rank r trains on cuda:LOCAL_RANK (or the CPU) with its shard of the data
        parallel = parse_parallelism(config.parallelism)[0]
        self.ddp, self.dp = parallel == "ddp", parallel == "dp"
        device = config.device
        if self.ddp:
            self.rank, self.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}" if self.cuda else "cpu"
        self.device = torch.device(device)
        torch.manual_seed(config.seed)
        if self.cuda:
            torch.cuda.set_device(self.device)
        if self.ddp:
            import torch.distributed as dist

            dist.init_process_group("nccl" if self.cuda else "gloo")
            torch.backends.cudnn.benchmark = True
            tf32 = config.precision == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = tf32  # fp32 means true fp32, not TF32
            torch.backends.cudnn.allow_tf32 = tf32
        self.model = build_model(spec, spec.init_weights(config.seed)).to(self.device)
        self.model.train()
        checkpointing = "none"
        if config.checkpointing == "activations":  # before DDP/DP wrap it: their replicas checkpoint too
            self.model = checkpointed(self.model)
            checkpointing = self.model.describe()
        if self.ddp:  # every rank starts from the same weights (and DDP broadcasts rank 0's)
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(self.model, device_ids=[self.device.index] if self.cuda else None)
        if self.dp:  # one process; each (merged) batch is scattered over cuda:0..N-1
            self.model = nn.DataParallel(self.model, device_ids=list(range(config.devices)))
        self.optimizer = make_optimizer(config.optimizer, self.model.parameters(), config.lr, fused=self.cuda)
        self.loss_fn = nn.CrossEntropyLoss()
        self.n_batches = batches.n_batches
        self.accum = config.accum_steps
        self._i = 0
        self.loader = None
        if config.data == "pipeline":
            # the framework's real input pipeline over the same samples, in the same order
            flat = TensorDataset(torch.from_numpy(batches.x.reshape(-1, *batches.x.shape[2:])),
                                 torch.from_numpy(batches.y.reshape(-1)))
            self.loader = DataLoader(flat, batch_size=config.batch_size, shuffle=False, drop_last=True,
                                     num_workers=config.data_workers, pin_memory=self.cuda,
                                     persistent_workers=config.data_workers > 0)
            self._iter = iter(self.loader)
        else:
            self.x = torch.from_numpy(batches.x).to(self.device)
            self.y = torch.from_numpy(batches.y).to(self.device)
        dtype = AUTOCAST_DTYPES.get(config.precision)
        self.autocast = (torch.autocast(device_type=self.device.type, dtype=dtype) if dtype is not None
                         else contextlib.nullcontext())
        self.scaler = torch.amp.GradScaler(self.device.type) if config.precision == "amp-fp16" else None
        self._loss: torch.Tensor | None = None
        self._info = {
            "optimizer_impl": "fused" if self.cuda else "default",
            "autocast_dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
            "grad_scaler": self.scaler is not None,
            "cudnn_benchmark": self.cuda,
            "tf32": config.precision == "tf32",
            "num_threads": torch.get_num_threads(),
            "step_timing": "cuda_events" if self.cuda else "host_clock",
            "grad_accum": self.accum,
            "checkpointing": checkpointing,
            "distributed": (f"DistributedDataParallel({'nccl' if self.cuda else 'gloo'}, world_size="
                            f"{self.world_size})" if self.ddp else
                            f"DataParallel(device_ids={list(range(config.devices))})" if self.dp else None),
            "data": (f"DataLoader(num_workers={config.data_workers}, pin_memory={self.cuda})"
                     if self.loader is not None else "device-resident"),
        }
        if self.cuda:
            self.sync()
            torch.cuda.reset_peak_memory_stats(self.device)

    def _next_pipeline_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            x, y = next(self._iter)
        except StopIteration:  # a new epoch: its start-up cost is part of pipeline mode
            self._iter = iter(self.loader)
            x, y = next(self._iter)
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.loader is not None:
            return self._next_pipeline_batch()
        i = self._i
        self._i = (i + 1) % self.n_batches
        return self.x[i], self.y[i]

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.accum == 1:
            x, y = self._next_batch()
            with self.autocast:
                loss = self.loss_fn(self.model(x), y)
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        else:  # gradient accumulation: the mean loss over the micro-batches, one update
            loss = None
            for _ in range(self.accum):
                x, y = self._next_batch()
                with self.autocast:
                    part = self.loss_fn(self.model(x), y) / self.accum
                (self.scaler.scale(part) if self.scaler is not None else part).backward()
                loss = part.detach() if loss is None else loss + part.detach()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self._loss = loss.detach()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def read_loss(self) -> float:
        """The last step's loss; with ddp, its mean over the ranks (a collective: every rank
        reads it at the same point, outside the timed region)."""
        if self._loss is None:
            return float("nan")
        if not self.ddp:
            return float(self._loss.float().item())
        import torch.distributed as dist

        loss = self._loss.float().clone()
        dist.all_reduce(loss)
        return float(loss.item()) / self.world_size

    def all_gather(self, obj: Any) -> list[Any]:
        if not self.ddp:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def weights_digest(self) -> str | None:
        h = hashlib.sha1()
        for p in self.model.parameters():
            h.update(p.detach().float().cpu().numpy().tobytes())
        return h.hexdigest()

    def close(self) -> None:
        if self.ddp:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    def step_timer(self, n_steps: int) -> StepTimer:
        return CudaEventTimer(n_steps) if self.cuda else HostStepTimer(n_steps)

    def memory(self) -> dict[str, int]:
        if not self.cuda:
            return {}
        return {
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(self.device)),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(self.device)),
        }

    def describe(self) -> dict[str, Any]:
        return dict(self._info)
