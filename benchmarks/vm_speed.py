"""This machine's speed of the moment, for reading a CI's wall time: a slower VM is seen as such.

Prints three figures, each the best of 3 (the machine's speed, not its noise): a bare
``import torch; torch.ones(1)`` in a fresh interpreter, a fixed pure-Python loop, and a bare
PyTorch training loop (a 2x256 MLP, batch 64, Adam, 300 steps, one thread). ``.ci/run`` prints
them beside its stage times; docs/performance.md records them with each CI's figures.

    python benchmarks/vm_speed.py
"""

from __future__ import annotations

import subprocess
import sys
import time


def best(f, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def python_loop() -> None:
    total = 0
    for i in range(3_000_000):
        total += i * i


def torch_loop() -> None:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    for _ in range(300):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def main() -> int:
    import torch

    torch.set_num_threads(1)
    imp = best(lambda: subprocess.run([sys.executable, "-c", "import torch; torch.ones(1)"], check=True))
    print(f"vm speed: import torch {imp:.3f} s, python loop {best(python_loop):.3f} s, "
          f"torch loop (300 steps, 1 thread) {best(torch_loop):.3f} s (best of 3 each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
