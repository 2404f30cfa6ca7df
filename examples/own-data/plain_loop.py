"""The same training as suite.toml, as a plain PyTorch loop: the digits' TensorDataset in a
shuffling DataLoader (batch 32, the last partial batch dropped), the MLP, Adam at lr 0.001, the
whole held-out split evaluated every 10 steps; prints the steps to a held-out loss of 0.15 for
each seed. gpubench's steps to the target, over its repeats, are compared with these
(docs/own-model.md, "Your own data"; tests/test_own_data.py).

    python plain_loop.py [seeds] [target]
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

import digits


def steps_to_target(seed: int, target: float = 0.15, eval_every: int = 10, max_steps: int = 3000) -> int | None:
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    model = digits.mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    loader = DataLoader(digits.train_dataset(), batch_size=32, shuffle=True, drop_last=True)
    hx, hy = digits.held_out_dataset().tensors
    step = 0
    while step < max_steps:
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            step += 1
            if step % eval_every == 0:
                with torch.no_grad():
                    if float(nn.functional.cross_entropy(model(hx), hy)) <= target:
                        return step
            if step >= max_steps:
                return None
    return None


if __name__ == "__main__":
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    target = float(sys.argv[2]) if len(sys.argv) > 2 else 0.15
    print(" ".join(str(steps_to_target(seed, target)) for seed in range(seeds)))
