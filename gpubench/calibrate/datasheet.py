"""Published datasheet peaks of a few GPUs: shown beside the measured figures as labelled
reference values, never used for MFU (which is always against the measured peak).

Dense figures (NVIDIA's datasheets print tensor-core figures with 2:4 sparsity; dense is half
of those). Sources: NVIDIA H100 Tensor Core GPU datasheet (SXM5 and PCIe columns), NVIDIA
H200 Tensor Core GPU datasheet (SXM column), NVIDIA A100 Tensor Core GPU datasheet (80GB SXM
column); the H100 figures to one decimal as in the Hopper architecture whitepaper.
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


_H100_SXM = {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}

DATASHEETS = (
    # "NVIDIA H100 80GB HBM3" is the SXM5 part; the PCIe card says PCIe, the NVL card NVL
    Datasheet("NVIDIA H100 SXM5 80GB", r"\bH100\b.*(HBM3|SXM)", _H100_SXM, 3350.0),
    Datasheet("NVIDIA H100 PCIe 80GB", r"\bH100\b.*PCIe", {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
              2000.0),
    Datasheet("NVIDIA H200 SXM 141GB", r"\bH200\b(?!.*NVL)", _H100_SXM, 4800.0),
    Datasheet("NVIDIA A100 SXM4 80GB", r"\bA100\b.*SXM.*80GB", {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0,
                                                                "bf16": 312.0}, 2039.0),
)


def datasheet_for(device_name: str | None) -> Datasheet | None:
    """The datasheet entry of a GPU by the name PyTorch reports, or None when not in the table."""
    if not device_name:
        return None
    return next((d for d in DATASHEETS if re.search(d.pattern, device_name)), None)
