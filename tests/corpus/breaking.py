"""A user's model whose forward breaks torch.compile's graph once where GPUBENCH_TEST_BREAK=1
when it is built: a stand-in for a change that adds a graph break, for the compile-cost
metrics' test (tests/test_compile.py)."""

from __future__ import annotations

import os


def mlp(width: int = 32, classes: int = 10):
    import torch
    from torch import nn

    breaks = os.environ.get("GPUBENCH_TEST_BREAK") == "1"

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(width, width)
            self.b = nn.Linear(width, classes)

        def forward(self, x):
            h = torch.relu(self.a(x))
            if breaks:
                torch._dynamo.graph_break()
            return self.b(h)

    return Net()
