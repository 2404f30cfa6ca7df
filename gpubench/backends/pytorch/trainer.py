"""The PyTorch trainer: one model, optimizer and device-resident data set."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpubench.backends.base import Lap, NativeModel, Trainer, Unsupported, no_lap
from gpubench.backends.pytorch.checkpointing import checkpointed
from gpubench.backends.pytorch.compile import (
    TORCH_COMPILE_MODES,
    CompileCounter,
    CudaGraphStep,
    StepSource,
    build_step,
    channels_last_pool,
    compile_model,
)
from gpubench.backends.pytorch.native import Tensors, as_native, call_model, cross_entropy
from gpubench.backends.pytorch.sharding import apply, local, param_groups, state_bytes
from gpubench.config import Config
from gpubench.measure.timers import HostStepTimer, StepTimer
from gpubench.options import OPTIMIZER_SETTINGS, device_index, device_kind
from gpubench.workloads.base import WorkloadSpec
from gpubench.workloads.data import Batches, tree_leaves, tree_map

if TYPE_CHECKING:
    from torch.optim.optimizer import ParamsT

    from gpubench.backends.pytorch.profiling import NvtxRanges
    from gpubench.measure.clocks import PhaseClock

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


def make_optimizer(name: str, params: ParamsT, lr: float, fused: bool, capturable: bool = False,
                   settings: dict[str, float] | None = None, impl: str = "auto") -> torch.optim.Optimizer:
    """adam / adamw / sgd with ``settings`` (``Config.optimizer_settings()``; the defaults of
    ``options.OPTIMIZER_SETTINGS`` where None). ``impl`` (``Config.optimizer_impl``): ``auto``
    takes the single-kernel implementations where ``fused`` (the fastest standard path on CUDA)
    and PyTorch's default elsewhere; ``for-loop``, ``foreach`` and ``fused`` ask for that one.
    ``capturable`` keeps Adam's step count on the device, as CUDA-graph capture requires (SGD has
    no host state to keep)."""
    s = {**OPTIMIZER_SETTINGS.get(name, {}), **(settings or {})}
    kw: dict[str, Any] = {"auto": {"fused": True} if fused else {}, "fused": {"fused": True},
                          "foreach": {"foreach": True}, "for-loop": {"foreach": False}}[impl]
    if capturable and name in ("adam", "adamw"):
        kw["capturable"] = True
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(s["beta1"], s["beta2"]), eps=s["eps"], **kw)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(s["beta1"], s["beta2"]), eps=s["eps"],
                                 weight_decay=s["weight_decay"], **kw)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=s["momentum"], **kw)
    raise ValueError(f"unknown optimizer {name!r}")


def warmup(optimizer: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR | None:
    """``lr_warmup_steps``: the learning rate of optimizer step k (from 0) lr x (k + 1) / steps,
    then lr (stepped after each optimizer step); None without a warm-up."""
    if steps <= 0:
        return None
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / steps))


class AutocastModule(nn.Module):
    """``inner`` under autocast with ``dtype``, entered afresh on every call, so that it holds in
    whichever thread runs it: DataParallel runs each replica in a thread of its own and
    carries only whether autocast is on into it, not its dtype (a new thread's CUDA autocast
    dtype is float16, so amp-bf16 replicas would run in float16). With ``float_output`` the
    output is cast to float32 (a pipeline's last stage: the loss in float32, as in the
    single-process trainer)."""

    def __init__(self, inner: nn.Module, device_type: str, dtype: torch.dtype, float_output: bool = False) -> None:
        super().__init__()
        self.inner, self.device_type, self.dtype, self.float_output = inner, device_type, dtype, float_output

    def forward(self, *args: object, **kwargs: object) -> object:
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            out = self.inner(*args, **kwargs)
        return out.float() if self.float_output else out


class TorchTrainerBase(Trainer):
    """What every PyTorch trainer shares: the device (for a distributed config, rank r's:
    ``cuda:LOCAL_RANK`` or the CPU, with the process group set up), precision flags, timers,
    memory figures and the rank collectives."""

    model: nn.Module  # set by each subclass: the whole model, or this rank's pipeline stage

    def _setup(self, config: Config) -> None:
        self.cuda = device_kind(config.device) == "cuda"
        # ddp:N / pipeline:N: one process per rank, started by torchrun, which sets RANK,
        # WORLD_SIZE and LOCAL_RANK; rank r trains on cuda:LOCAL_RANK (or the CPU)
        self.distributed = config.distributed
        # always with an index: torch.cuda.set_device refuses a bare "cuda"
        device = f"cuda:{device_index(config.device)}" if self.cuda else "cpu"
        if self.distributed:
            self.rank, self.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}" if self.cuda else "cpu"
        self.device = torch.device(device)
        torch.manual_seed(config.init_seed)
        if self.cuda:  # every CUDA config, not only distributed ones
            torch.cuda.set_device(self.device)
            torch.backends.cudnn.benchmark = True
            tf32 = config.precision == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = tf32  # fp32 means true fp32, not TF32
            torch.backends.cudnn.allow_tf32 = tf32
        if self.distributed:
            import torch.distributed as dist

            dist.init_process_group(self.backend_name)
        self.autocast_dtype = dtype = AUTOCAST_DTYPES.get(config.precision)
        # graph capture needs autocast's weight-cast cache off (PyTorch's CUDA-graph notes)
        self.autocast = (torch.autocast(device_type=self.device.type, dtype=dtype,
                                        cache_enabled=config.compile != "cuda-graph")
                         if dtype is not None else contextlib.nullcontext())
        self._info: dict[str, Any] = {
            "optimizer_impl": ({"auto": "fused" if self.cuda else "default"}.get(config.optimizer_impl,
                                                                                config.optimizer_impl)),
            "autocast_dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
            "cudnn_benchmark": self.cuda,
            "tf32": config.precision == "tf32",
            "num_threads": torch.get_num_threads(),
            "step_timing": "cuda_events" if self.cuda else "host_clock",
        }

    @property
    def backend_name(self) -> str:
        return "nccl" if self.cuda else "gloo"

    def _ready(self) -> None:
        """The end of construction: the GPU synchronised and its peaks reset."""
        if self.cuda:
            self.sync()
            torch.cuda.reset_peak_memory_stats(self.device)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def all_gather(self, obj: object) -> list[Any]:
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def weights_digest(self) -> str | None:
        h = hashlib.sha1()
        for p in self.model.parameters():  # this rank's part of a sharded one (fsdp, tp: compared with no other)
            h.update(local(p).detach().float().cpu().numpy().tobytes())
        return h.hexdigest()

    def close(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    def step_timer(self, n_steps: int) -> StepTimer:
        return CudaEventTimer(n_steps) if self.cuda else HostStepTimer(n_steps)

    def phase_clock(self) -> PhaseClock:
        if not self.cuda:
            return super().phase_clock()
        from gpubench.backends.pytorch.profiling import CudaEventPhaseClock

        return CudaEventPhaseClock(self.device)

    def ranges(self) -> NvtxRanges | None:
        from gpubench.backends.pytorch.profiling import NvtxRanges

        return NvtxRanges() if self.cuda else None

    def profile(self, steps: int, out_dir: Path) -> dict[str, Any]:
        """Every PyTorch trainer (the pipeline's too: its other ranks take the same steps)."""
        from gpubench.backends.pytorch.profiling import profile_steps

        return profile_steps(self, steps, out_dir, cuda=self.cuda)

    def memory(self) -> dict[str, int]:
        if not self.cuda:
            return {}
        return {
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(self.device)),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(self.device)),
        }

    def describe(self) -> dict[str, Any]:
        return dict(self._info)

    def state_bytes(self) -> dict[str, int]:
        return state_bytes(self.model, getattr(self, "optimizer", None))


class TorchTrainer(TorchTrainerBase):
    def __init__(self, native: NativeModel | WorkloadSpec, config: Config, batches: Batches) -> None:
        native = as_native(native, config)
        parallel = config.parallel.kind
        self.ddp, self.dp = parallel == "ddp", parallel == "dp"
        self.sharded = parallel if parallel in ("fsdp", "tp", "fsdp+tp") else None
        if config.checkpointing == "activations" and not native.sequential:
            raise Unsupported("checkpointing = activations cuts a plain chain of layers (torch.nn.Sequential) into "
                              f"runs; {config.workload} is not one (use checkpointing = none)")
        # channels-last: conv weights and every input batch in NHWC memory order
        if config.memory_format == "channels-last" and (batches.structured or batches.x.ndim != 5):
            raise Unsupported("memory_format = channels-last is a layout of 4-D (N, C, H, W) tensors; "
                              f"{config.workload} takes other inputs")
        if self.dp and batches.structured:
            raise Unsupported("dp:N scatters one input tensor over the GPUs; this model takes several (use ddp:N)")
        self._setup(config)
        self.memory_format = torch.channels_last if config.memory_format == "channels-last" else None
        model = native.build()
        # Module.to takes memory_format at run time (it forwards to Tensor.to); torch's stubs omit it
        self.model = (model.to(self.device, memory_format=self.memory_format)
                      if self.memory_format is not None else model.to(self.device))
        self.model.train()
        checkpointing = "none"
        if config.checkpointing == "activations":  # before DDP/DP wrap it: their replicas checkpoint too
            assert isinstance(self.model, nn.Sequential)  # native.sequential, checked above
            self.model = checkpointed(self.model)
            checkpointing = self.model.describe()
        distributed = self._distribute(config)
        graphed = config.compile == "cuda-graph"
        params = param_groups(self.model) if self.sharded else self.model.parameters()
        self.optimizer = make_optimizer(config.optimizer, params, config.lr, fused=self.cuda,
                                        settings=config.optimizer_settings(),
                                        capturable=graphed, impl=config.optimizer_impl)
        self.scheduler = warmup(self.optimizer, config.lr_warmup_steps)
        self.loss_fn: Callable[[Any, Any], Any] = native.loss or cross_entropy
        self.n_batches = batches.n_batches
        self.accum = config.accum_steps
        self._i = 0
        self.loader: DataLoader[tuple[torch.Tensor, ...]] | None = None
        self._iter: Iterator[list[torch.Tensor]] | None = None
        self._tree = (batches.x, batches.y)  # the structure a batch is rebuilt into
        if config.data == "pipeline":
            # the framework's real input pipeline over the same samples, in the same order (every
            # array of a structured batch one tensor of the dataset)
            leaves = tree_leaves(self._tree)
            flat = TensorDataset(*(torch.from_numpy(a.reshape(-1, *a.shape[2:])) for a in leaves))
            # the batch of one step as the data holds it: dp:N's global batch is N x batch_size
            self.loader = DataLoader(flat, batch_size=batches.batch_size, shuffle=False, drop_last=True,
                                     num_workers=config.data_workers, pin_memory=self.cuda,
                                     persistent_workers=config.data_workers > 0)
            self._iter = iter(self.loader)
        else:
            self.x = tree_map(lambda a: torch.from_numpy(a).to(self.device), batches.x)
            if self.memory_format is not None:
                self.x = channels_last_pool(self.x)
            self.y = tree_map(lambda a: torch.from_numpy(a).to(self.device), batches.y)
        self.scaler = torch.amp.GradScaler(self.device.type) if config.precision == "amp-fp16" else None
        self._losses: list[torch.Tensor] = []  # every unread step's loss, on the device
        self._compiles = CompileCounter() if config.compile in TORCH_COMPILE_MODES else None
        self.forward, compile_info = compile_model(self.model, config)
        self.min_warmup_steps = compile_info.pop("min_warmup_steps", 0)
        self._step = build_step(StepSource(
            train_step=self.train_step, next_batch=self._next_batch, cuda=self.cuda, model=self.model,
            optimizer=self.optimizer, device=self.device, x=getattr(self, "x", None), y=getattr(self, "y", None),
            n_batches=self.n_batches, memory_format=self.memory_format, position=lambda: self._i, seek=self._seek),
            config)
        self._info.update({
            "grad_scaler": self.scaler is not None,
            "grad_accum": self.accum,
            "checkpointing": checkpointing,
            "distributed": distributed,
            "data": (f"DataLoader(num_workers={config.data_workers}, pin_memory={self.cuda})"
                     if self.loader is not None else "device-resident"),
            "compile": CudaGraphStep.describe() if graphed else compile_info,
            "memory_format": "channels_last" if self.memory_format is not None else "contiguous",
        })
        self._ready()

    def _distribute(self, config: Config) -> str | None:
        """The model wrapped or split for its parallelism (every rank starts from the same
        seeded weights); returns what the result's runtime says of it. ddp: DDP also broadcasts
        rank 0's weights; dp: each (merged) batch is scattered over cuda:0..N-1; fsdp, tp and
        fsdp+tp: gpubench.backends.pytorch.sharding."""
        world = self.world_size
        if self.ddp:
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(self.model, device_ids=[self.device.index] if self.cuda else None)
            return f"DistributedDataParallel({self.backend_name}, world_size={world})"
        if self.dp:
            if self.autocast_dtype is not None:
                self.model = AutocastModule(self.model, self.device.type, self.autocast_dtype)
            self.model = nn.DataParallel(self.model, device_ids=list(range(config.devices)))
            return f"DataParallel(device_ids={list(range(config.devices))})"
        if self.sharded:
            self._info["sharding"] = apply(self.model, config, self.device, world, self.autocast_dtype)
            wrapped = {"fsdp": "fully_shard", "tp": "parallelize_module"}
            return "+".join(wrapped[axis] for axis in self._info["sharding"]) + (
                f"({self.backend_name}, world_size={world})")
        return None

    def close(self) -> None:
        """Also ends the input pipeline's worker processes now: left to the garbage collector,
        the DataLoader's shutdown can run after its queues are finalised and then waits 5 s
        for each worker."""
        self._iter = self.loader = None
        super().close()

    def _next_pipeline_batch(self) -> tuple[Tensors, Tensors]:
        assert self._iter is not None and self.loader is not None  # pipeline mode, not closed
        try:
            leaves = next(self._iter)
        except StopIteration:  # a new epoch: its start-up cost is part of pipeline mode
            self._iter = iter(self.loader)
            leaves = next(self._iter)
        if self.memory_format is not None:
            x, y = leaves
            return (x.to(self.device, non_blocking=True, memory_format=self.memory_format),
                    y.to(self.device, non_blocking=True))
        moved = iter([a.to(self.device, non_blocking=True) for a in leaves])
        return tree_map(lambda _: next(moved), self._tree)

    def _seek(self, i: int) -> None:
        self._i = i

    def _next_batch(self) -> tuple[Tensors, Tensors]:
        if self.loader is not None:
            return self._next_pipeline_batch()
        i = self._i
        self._i = (i + 1) % self.n_batches
        return tree_map(lambda a: a[i], self.x), tree_map(lambda a: a[i], self.y)

    def train_step(self, next_batch: Callable[[], tuple[Tensors, Tensors]], lap: Lap = no_lap) -> torch.Tensor:
        """One optimizer update on the next batch, or (gradient accumulation) on the mean loss
        over ``accum`` micro-batches; returns the detached loss. ``lap(phase)`` ends each phase
        (the breakdown pass; a no-op otherwise). Built into a step by compile.build_step."""
        self.optimizer.zero_grad(set_to_none=True)
        loss: torch.Tensor | None = None
        for _ in range(self.accum):
            x, y = next_batch()
            lap("data")
            with self.autocast:
                part = self.loss_fn(call_model(self.forward, x), y)
            if self.accum > 1:
                part = part / self.accum
            lap("forward")
            (self.scaler.scale(part) if self.scaler is not None else part).backward()
            lap("backward")
            loss = part.detach() if loss is None else loss + part.detach()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        lap("optimizer")
        assert loss is not None  # accum >= 1: at least one micro-batch
        return loss

    def step(self) -> None:
        self._losses.append(self._step())

    def phased_step(self, lap: Lap) -> None:
        self._losses.append(self._step(lap))

    def compile_events(self) -> int | None:
        return self._compiles.count if self._compiles is not None and self._compiles.available else None

    def graph_breaks(self) -> int | None:
        return self._compiles.graph_breaks() if self._compiles is not None and self._compiles.available else None

    def evaluate(self, batches: Batches) -> float:
        """The mean loss over held-out ``batches``: the model in eval mode (dropout off, batch
        norm's running statistics), no gradients, the config's autocast; eager, not compiled."""
        def batch(i: int) -> tuple[Tensors, Tensors]:
            def put(a: Any) -> torch.Tensor:
                return torch.from_numpy(a[i]).to(self.device)
            return tree_map(put, batches.x), tree_map(put, batches.y)

        self.model.eval()
        try:
            with torch.no_grad(), self.autocast:
                losses = [self.loss_fn(call_model(self.model, x), y).float()
                          for x, y in map(batch, range(batches.n_batches))]
            return float(torch.stack(losses).mean())
        finally:
            self.model.train()

    def read_losses(self) -> list[float]:
        """Every unread step's loss, in one copy to the host; with ddp, each its mean over the
        ranks (a collective: every rank reads at the same point, outside the timed region)."""
        if not self._losses:
            return []
        losses, self._losses = torch.stack(self._losses).float(), []
        if self.ddp or self.sharded in ("fsdp", "fsdp+tp"):  # (a replica's tp ranks all compute the same loss)
            import torch.distributed as dist

            dist.all_reduce(losses)
            losses /= self.world_size
        return losses.tolist()
