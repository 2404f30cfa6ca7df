"""Published datasheet peaks of GPUs: the denominator of ``mfu_datasheet`` (the field's
convention: PaLM, nanoGPT, llm.c, torchtitan and Megatron all divide by the datasheet's dense
peak), and shown beside the measured figures of ``gpubench calibrate``. ``mfu`` itself is
against the peak measured on the machine.

Dense figures (NVIDIA's datasheets print tensor-core figures with 2:4 sparsity; dense is half
of those). Each row names its source document; the H100 figures to one decimal as in the
Hopper architecture whitepaper.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Datasheet:
    label: str
    pattern: str  # regular expression matched against the device name PyTorch reports
    tflops: dict[str, float]  # dense peak per calibration precision (fp32, tf32, fp16, bf16)
    bandwidth_gbs: float  # memory bandwidth, GB/s (1e9 bytes/s)
    source: str  # the document the figures are from


_H100_SOURCE = "NVIDIA H100 Tensor Core GPU datasheet (dense: half the sparse figures)"
_H100_SXM = {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}

DATASHEETS = (
    # "NVIDIA H100 80GB HBM3" is the SXM5 part; the PCIe card says PCIe, the NVL card NVL
    Datasheet("NVIDIA H100 SXM5 80GB", r"\bH100\b.*(HBM3|SXM)", _H100_SXM, 3350.0, _H100_SOURCE + ", SXM column"),
    Datasheet("NVIDIA H100 PCIe 80GB", r"\bH100\b.*PCIe", {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
              2000.0, _H100_SOURCE + ", PCIe column"),
    Datasheet("NVIDIA H200 SXM 141GB", r"\bH200\b(?!.*NVL)", _H100_SXM, 4800.0,
              "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column"),
    Datasheet("NVIDIA A100 SXM4 80GB", r"\bA100\b.*SXM.*80GB", {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0,
                                                                "bf16": 312.0}, 2039.0,
              "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column"),
)


def datasheet_for(device_name: str | None) -> Datasheet | None:
    """The datasheet entry of a GPU by the name PyTorch reports, or None when not in the table."""
    if not device_name:
        return None
    return next((d for d in DATASHEETS if re.search(d.pattern, device_name)), None)
