"""The workload registry: one name per framework-neutral model family."""

from __future__ import annotations

from gpubench.errors import choices_message
from gpubench.options import ATTENTION_WORKLOADS
from gpubench.workloads.base import Workload, WorkloadSpec
from gpubench.workloads.cnn import CNN
from gpubench.workloads.gpt import GPT
from gpubench.workloads.mlp import MLP
from gpubench.workloads.resnet import RESNET18, RESNET50
from gpubench.workloads.vit import VIT

WORKLOADS: dict[str, Workload] = {w.name: w for w in (CNN, MLP, RESNET18, RESNET50, VIT, GPT)}


def register_workload(workload: Workload) -> None:
    """Add a workload (used by plugins)."""
    WORKLOADS[workload.name] = workload
    if workload.attention:
        ATTENTION_WORKLOADS.add(workload.name)


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(choices_message("workload", name, sorted(WORKLOADS))) from None


__all__ = ["WORKLOADS", "Workload", "WorkloadSpec", "get_workload", "register_workload"]
