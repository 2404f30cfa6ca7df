"""Published datasheet peaks of GPUs: the denominator of ``mfu_datasheet`` (the field's
convention: PaLM, nanoGPT, llm.c, torchtitan and Megatron all divide by the datasheet's dense
peak), and the row ``gpubench calibrate`` judges a machine's measured peaks against. ``mfu``
itself is against the peak measured on the machine.

Dense figures: NVIDIA's datasheets print tensor-core figures with 2:4 sparsity (marked ``*``),
and dense is half of those. fp16/bf16 are the rates with fp32 accumulation, the ones
frameworks use (a GeForce card's fp16-accumulate rate is twice its figure here). A precision
the part has no figure for (bf16 on Volta and Turing, fp8 before Ada and Hopper, a figure
the sources disagree on) is absent from its row, and nothing is judged against it.

Each row names its source document and the device names drivers report for it (a test
matches each name to its row); ``watts`` is the power limit the figures assume. Parts left out,
and why, are in ``NOT_IN_TABLE``. The reference page (docs/reference/datasheets.md) is
generated from this table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Datasheet:
    label: str
    pattern: str  # regular expression searched for in the device name the driver reports (any case)
    names: tuple[str, ...]  # names drivers report for the part, each matched by a test
    tflops: dict[str, float]  # dense peak per precision (fp32, tf32, fp16, bf16, fp8) where the source has it
    bandwidth_gbs: float | None  # memory bandwidth, GB/s (1e9 bytes/s)
    watts: float | None  # the board power limit the figures assume
    source: str  # the document the figures are from
    note: str = field(default="")  # what a reader should know about the row


PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")

_A100 = {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}  # every A100 SKU has the same compute
_A100_SOURCE = "NVIDIA A100 Tensor Core GPU datasheet"
_H100_SOURCE = "NVIDIA H100 Tensor Core GPU datasheet and the NVIDIA H100 Tensor Core GPU Architecture whitepaper"
_HOPPER_SXM = {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}  # the whitepaper's
_HOPPER_NVL = {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5}
_V100_SOURCE = "NVIDIA Tesla V100 GPU datasheet"
_NO_BF16 = "no bf16 tensor cores (a bf16 config runs, but there is no datasheet figure to divide by)"

DATASHEETS = (
    # "NVIDIA H100 80GB HBM3" is the SXM5 part; the PCIe card says PCIe, the NVL card NVL
    Datasheet("NVIDIA H100 SXM5 80GB", r"\bH100\b(?!.*(NVL|PCIe)).*(HBM3|SXM)", ("NVIDIA H100 80GB HBM3",),
              _HOPPER_SXM, 3350.0, 700.0, _H100_SOURCE + ", SXM column (figures to one decimal from the whitepaper)"),
    Datasheet("NVIDIA H100 PCIe 80GB", r"\bH100\b.*PCIe", ("NVIDIA H100 PCIe",),
              {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0}, 2000.0, 350.0,
              _H100_SOURCE + ", PCIe column; NVIDIA H100 PCIe product brief PB-11133-001 (350 W)",
              "the datasheet's power is configurable, 300-350 W"),
    Datasheet("NVIDIA H100 NVL 94GB", r"\bH100\b.*NVL", ("NVIDIA H100 NVL",), _HOPPER_NVL, 3900.0, 400.0,
              "NVIDIA H100 datasheet, H100 NVL column (one GPU, 94 GB); NVIDIA H100 NVL product brief PB-11773-001",
              "per GPU: older sheets printed the two-GPU pair (188 GB, 7.8 TB/s); power configurable, 350-400 W"),
    Datasheet("NVIDIA H200 SXM 141GB", r"\bH200\b(?!.*NVL)", ("NVIDIA H200",), _HOPPER_SXM, 4800.0, 700.0,
              "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column", "the compute of the H100 SXM"),
    Datasheet("NVIDIA H200 NVL 141GB", r"\bH200\b.*NVL", ("NVIDIA H200 NVL",), _HOPPER_NVL, 4800.0, 600.0,
              "NVIDIA H200 Tensor Core GPU datasheet, H200 NVL column", "power configurable, up to 600 W"),
    Datasheet("NVIDIA A100 SXM4 80GB", r"\bA100\b.*SXM.*80GB", ("NVIDIA A100-SXM4-80GB",), _A100, 2039.0, 400.0,
              _A100_SOURCE + ", A100 80GB SXM column"),
    Datasheet("NVIDIA A100 SXM4 40GB", r"\bA100\b.*SXM.*40GB", ("NVIDIA A100-SXM4-40GB",), _A100, 1555.0, 400.0,
              _A100_SOURCE + " (40GB edition), A100 40GB SXM column; NVIDIA Ampere architecture whitepaper"),
    Datasheet("NVIDIA A100 PCIe 80GB", r"\bA100\b.*(80GB.*PCIe|PCIe.*80GB)", ("NVIDIA A100 80GB PCIe",), _A100,
              1935.0, 300.0, _A100_SOURCE + ", A100 80GB PCIe column"),
    Datasheet("NVIDIA A100 PCIe 40GB", r"\bA100\b.*(40GB.*PCIe|PCIe.*40GB)", ("NVIDIA A100-PCIE-40GB",), _A100,
              1555.0, 250.0, _A100_SOURCE + " (40GB edition), A100 40GB PCIe column"),
    Datasheet("NVIDIA B200", r"\bB200\b", ("NVIDIA B200",), {"fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0},
              8000.0, 1000.0, "NVIDIA Blackwell datasheet, HGX B200 column; NVIDIA DGX B200 page (64 TB/s per 8 GPUs)",
              "fp32 and tf32 left out: NVIDIA's B200 documents give different figures; the GB200 (1,200 W) is "
              "another part"),
    Datasheet("NVIDIA L40S", r"\bL40S\b", ("NVIDIA L40S",),
              {"fp32": 91.6, "tf32": 183.0, "fp16": 362.05, "bf16": 362.05, "fp8": 733.0}, 864.0, 350.0,
              "NVIDIA L40S GPU datasheet (it prints dense and sparse figures side by side)"),
    Datasheet("NVIDIA L4", r"\bL4\b", ("NVIDIA L4",),
              {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0, "fp8": 242.5}, 300.0, 72.0,
              "NVIDIA L4 Tensor Core GPU datasheet; NVIDIA L4 product brief PB-11316-001"),
    Datasheet("NVIDIA T4", r"\bT4\b", ("Tesla T4",), {"fp32": 8.1, "fp16": 65.0}, 320.0, 70.0,
              "NVIDIA T4 Tensor Core GPU datasheet (fp16: its mixed-precision figure)",
              "Turing: no tf32 and " + _NO_BF16 + "; the sheet says 320+ GB/s"),
    Datasheet("NVIDIA V100 SXM2", r"\bV100\b.*SXM2", ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"),
              {"fp32": 15.7, "fp16": 125.0}, 900.0, None, _V100_SOURCE + ", SXM2 column",
              "Volta: no tf32 and " + _NO_BF16 + "; the power the figures assume was not read off the sheet"),
    Datasheet("NVIDIA V100 PCIe", r"\bV100\b.*PCIE", ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"),
              {"fp32": 14.0, "fp16": 112.0}, 900.0, None, _V100_SOURCE + ", PCIe column",
              "Volta: no tf32 and " + _NO_BF16 + "; the V100S is another part"),
    Datasheet("NVIDIA GeForce RTX 4090", r"\bRTX 4090\b(?!\s*(D\b|Laptop))", ("NVIDIA GeForce RTX 4090",),
              {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2}, 1008.0, None,
              "NVIDIA Ada GPU architecture whitepaper, appendix table (GeForce RTX 4090)",
              "GeForce: fp16/bf16 at fp32 accumulation are half the fp16-accumulate figure; fp8 and the power "
              "limit left out (not read off the whitepaper); the 4090 D and the laptop part are other parts"),
)

NOT_IN_TABLE = {
    "NVIDIA A10G": "an AWS part with no NVIDIA datasheet; the A10's figures are not its own (its clocks differ)",
    "NVIDIA GeForce RTX 5090": "its fp16/bf16 rates at fp32 accumulation are in the RTX Blackwell whitepaper, "
                               "not yet read; review sites give only the fp16-accumulate sparse figure",
    "NVIDIA GH200": "the Grace Hopper superchip's GPU runs at its own power and clocks; no per-GPU datasheet "
                    "column was read",
}


def datasheet_for(device_name: str | None) -> Datasheet | None:
    """The datasheet entry of a GPU by the name its driver reports (the first row whose pattern
    it holds, in any case), or None when not in the table."""
    if not device_name:
        return None
    return next((d for d in DATASHEETS if re.search(d.pattern, device_name, re.IGNORECASE)), None)


def reference_markdown() -> str:
    """The table as the reference page shows it (docs/reference/datasheets.md)."""
    def tf(sheet: Datasheet, p: str) -> str:
        value = sheet.tflops.get(p)
        return "-" if value is None else f"{value:g}"

    out = ["Peaks in TFLOP/s, dense.\n",
           "| part | names the driver reports | " + " | ".join(PRECISIONS) + " | memory (GB/s) | power (W) | source "
           "| note |", "| --- " * (len(PRECISIONS) + 6) + "|"]
    for d in DATASHEETS:
        names = ", ".join(f"`{n}`" for n in d.names)
        out.append(f"| {d.label} | {names} | " + " | ".join(tf(d, p) for p in PRECISIONS)
                   + f" | {'-' if d.bandwidth_gbs is None else f'{d.bandwidth_gbs:g}'}"
                   + f" | {'-' if d.watts is None else f'{d.watts:g}'} | {d.source} | {d.note or '-'} |")
    out += ["", "## Not in the table\n", "A GPU not in the table has no `mfu_datasheet`, and `gpubench calibrate` "
            "gives it no verdict; its measured peaks and `mfu` are as on any GPU.\n"]
    out += [f"- `{name}`: {why}" for name, why in NOT_IN_TABLE.items()]
    return "\n".join(out) + "\n"
