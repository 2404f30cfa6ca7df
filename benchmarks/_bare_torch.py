"""The bare PyTorch side of benchmarks/overhead.py: the workload written out as an
``nn.Sequential`` and a plain training loop, timed as the wall time of N steps."""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from gpubench.workloads.base import WorkloadSpec
from gpubench.workloads.data import Batches


def bare_model(workload: str, depth: int, width: int) -> nn.Sequential:
    """The workload written out by hand (mirrors gpubench/workloads/{mlp,cnn}.py)."""
    if workload == "mlp":
        layers: list[nn.Module] = [nn.Flatten()]
        n_in = 28 * 28
        for _ in range(depth):
            layers += [nn.Linear(n_in, width), nn.ReLU()]
            n_in = width
        return nn.Sequential(*layers, nn.Linear(n_in, 10))
    return nn.Sequential(  # cnn
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
        nn.Linear(64 * 12 * 12, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10))


class BareLoop:
    """A plain PyTorch training loop; ``run(n)`` returns the wall seconds of n steps."""

    def __init__(self, args: argparse.Namespace, spec: WorkloadSpec, weights: list[list[np.ndarray]],
                 batches: Batches) -> None:
        dev = torch.device(args.device)
        self.cuda = dev.type == "cuda"
        if self.cuda:  # the same global settings gpubench's trainer makes
            torch.backends.cudnn.benchmark = True
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
        self.model = bare_model(args.workload, args.depth, args.width).to(dev).train()
        with torch.no_grad():  # canonical layout is PyTorch's: copy straight in
            for module, arrays in zip(self.model, weights, strict=True):
                for p, a in zip(module.parameters(), arrays, strict=True):
                    p.copy_(torch.from_numpy(a))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3, **({"fused": True} if self.cuda else {}))
        self.loss_fn = nn.CrossEntropyLoss()
        self.xs = torch.from_numpy(batches.x).to(dev)
        self.ys = torch.from_numpy(batches.y).to(dev)
        dtype = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}.get(args.precision)
        self.amp = torch.autocast(dev.type, dtype=dtype) if dtype else contextlib.nullcontext()
        self.scaler = torch.amp.GradScaler(dev.type) if args.precision == "amp-fp16" else None
        self.i = 0
        self.loss = float("nan")

    def run(self, n: int) -> float:
        """One untimed step (as run_loop's cold-start step), then n timed steps."""
        model, opt, loss_fn, amp, scaler, xs, ys = (self.model, self.opt, self.loss_fn, self.amp,
                                                    self.scaler, self.xs, self.ys)
        nb = xs.shape[0]

        def train(n: int, i: int) -> tuple[int, torch.Tensor]:
            for _ in range(n):
                x, y = xs[i], ys[i]
                i = (i + 1) % nb
                opt.zero_grad(set_to_none=True)
                with amp:
                    loss = loss_fn(model(x), y)
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                else:
                    loss.backward()
                    opt.step()
            return i, loss

        self.i, _ = train(1, self.i)
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.i, loss = train(n, self.i)
        if self.cuda:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        self.loss = float(loss.float().item())
        return t1 - t0


def describe(args: argparse.Namespace) -> tuple[str, str, dict[str, Any]]:
    """(device name, framework text for the header, framework fields for the JSON)."""
    dev = torch.device(args.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return (name, f"torch {torch.__version__}, {torch.get_num_threads()} threads",
            {"torch_version": torch.__version__, "num_threads": torch.get_num_threads()})
