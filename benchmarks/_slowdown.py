"""A real slowdown for the gate's benchmarks: this checkout's committed tree (HEAD) exported,
and its PyTorch trainer made to do extra work after every optimizer step (in-place passes over
the parameters, values unchanged), so training is really slower: a code regression, not
simulated numbers."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAINER = Path("gpubench/backends/pytorch/trainer.py")
ANCHOR = "        else:\n            self.optimizer.step()\n"
SLOWER = ANCHOR + ("            with torch.no_grad():  # {label}'s injected slowdown\n"
                   "                params = [p for p in self.model.parameters()]\n"
                   "                for _ in range({passes}):\n"
                   "                    torch._foreach_mul_(params, 1.0)\n")


def export_head(path: Path) -> Path:
    """HEAD's tree in ``path`` (made)."""
    path.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(path)], input=archive, check=True)
    return path


def inject(checkout: Path, passes: int, label: str) -> None:
    """Make the trainer in ``checkout`` do ``passes`` extra passes a step."""
    source = (checkout / TRAINER).read_text()
    assert ANCHOR in source, f"{TRAINER}: the injection point moved; update ANCHOR in benchmarks/_slowdown.py"
    (checkout / TRAINER).write_text(source.replace(ANCHOR, SLOWER.format(passes=passes, label=label), 1))
