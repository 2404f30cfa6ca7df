"""A scratch git repository for ``gpubench bisect``: a user's project (a PyTorch model named in
its suite as ``mynet:net``) over ``commits`` commits, one of which (``culprit``, 1-based) adds
real work to the model's forward pass: a matrix product of the batch with a 256 x ``cols`` buffer.
At 1024 columns (benchmarks/bisect_scratch.py) it made the training step a tenth slower on this
project's 2-vCPU VM (gpubench ab --lockstep, 8 rounds: -10.0% [-17.2%, -4.2%]); at 4096 (the
tests', which want every A/B decided at its first look) about twice as slow (gpubench run: 8.0 ms a
step against 16 ms). The others change a notes file. Used by the tests and by
benchmarks/bisect_scratch.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

MODEL = '''import torch
from torch import nn

EXTRA_COLS = {cols}  # columns of the extra product a step computes (0: none)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                  nn.Linear(512, 10))
        self.register_buffer("pad", torch.randn(256, max(1, EXTRA_COLS)))

    def forward(self, x):
        if EXTRA_COLS:
            with torch.no_grad():
                self.last = x @ self.pad  # work whose result is kept, so nothing elides it
        return self.body(x)


def net():
    return Net()
'''

SUITE = '''name = "scratch"
[defaults]
workload = "mynet:net"
framework = "torch"
device = "cpu"
input_shape = [256]
num_classes = 10
batch_size = 256
threads = 1
huge_pages = "transparent"
warmup_steps = 3
steps = 20
windows = 4
'''


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "Scratch Author", "GIT_AUTHOR_EMAIL": "author@example.com",
           "GIT_COMMITTER_NAME": "Scratch Author", "GIT_COMMITTER_EMAIL": "author@example.com",
           "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(repo)}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def make_repo(path: Path, commits: int = 16, culprit: int | None = 11, cols: int = 1024) -> list[str]:
    """The repository in ``path``; its commits' hashes, oldest first."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "suite.toml").write_text(SUITE)
    (path / ".gitignore").write_text(".gpubench/\nruns/\n__pycache__/\n")
    shas = []
    for i in range(1, commits + 1):
        slow = culprit is not None and i >= culprit
        (path / "mynet.py").write_text(MODEL.format(cols=cols if slow else 0))
        with (path / "notes.txt").open("a") as f:
            f.write(f"note {i}\n")
        git(path, "add", "-A")
        subject = "mynet: keep the batch's product with a padding buffer" if i == culprit else f"notes: line {i}"
        git(path, "commit", "-q", "-m", subject)
        shas.append(git(path, "rev-parse", "HEAD"))
    return shas
