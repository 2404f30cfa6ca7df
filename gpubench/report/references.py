"""Published figures a result can stand beside: a public run of the same model, each with its
source, put beside a config only on the terms it states (same model, precision, and for a rate
the same GPU and batch), and the table that says what still differs.

What a source states is kept as it states it; a figure derived from it (an MFU from tokens,
time and GPUs) says how. A figure measured as time to train (MLPerf Training's) has no
counterpart in a throughput and is not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from gpubench import fmt
from gpubench.calibrate.datasheet import datasheet_for

GPT2_SMALL_PARAMS = 124_439_808  # GPT-2 (124M): llm.c prints num_parameters: 124439808 for it
RESNET50_PARAMS = 25_557_032  # ResNet-50 v1.5 at 224x224, 1000 classes (torchvision's count)


@dataclass(frozen=True)
class Reference:
    name: str
    workload: str
    params: int  # the model's parameter count: its shape (model.params)
    precision: str
    metric: str  # "throughput" (samples/s of one device) or "mfu_datasheet"
    low: float
    high: float  # the published figure, or the ends of the range it gives
    source: str
    differs: str  # how the published run differs from a gpubench config that matches its terms
    gpu: str | None = None  # the datasheet row of its GPU: a rate is compared on that GPU only
    batch_size: int | None = None  # per GPU
    memory_format: str | None = None
    derived: str = ""  # how the figure follows from what the source states, where it is not stated

    def figure(self) -> str:
        if self.metric == "mfu_datasheet":
            return f"{self.low:.0%}" if self.low == self.high else f"{self.low:.0%}-{self.high:.0%}"
        return f"{self.low:,.0f} samples/s" if self.low == self.high else f"{self.low:,.0f}-{self.high:,.0f} samples/s"


_DLE = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, \"Training "
        "performance: NVIDIA DGX A100 (8x A100 80GB)\", the 1-GPU row (pytorch-21.03 NGC container); its batch "
        "and memory format from ConvNets/configs.yml (DGXA100)")
_DLE_DIFFERS = ("it read ImageNet JPEGs through its data loader, gpubench's batches are on the device; its "
                "training adds label smoothing and mixup")
_LLMC = ("llm.c, the discussion its README points to: \"Reproducing GPT-2 (124M) in llm.c in 90 minutes for $20\" "
         "(github.com/karpathy/llm.c)")
_NANOGPT = "nanoGPT README and config/train_gpt2.py (github.com/karpathy/nanoGPT)"

REFERENCES = (
    Reference("ResNet-50 v1.5, 1x A100 80GB, mixed precision", "resnet50", RESNET50_PARAMS, "amp-fp16",
              "throughput", 2470.0, 2470.0, _DLE, _DLE_DIFFERS, gpu="NVIDIA A100 SXM4 80GB", batch_size=256,
              memory_format="channels-last"),
    Reference("ResNet-50 v1.5, 1x A100 80GB, TF32", "resnet50", RESNET50_PARAMS, "tf32", "throughput", 938.0, 938.0,
              _DLE, _DLE_DIFFERS, gpu="NVIDIA A100 SXM4 80GB", batch_size=256, memory_format="contiguous"),
    Reference("GPT-2 (124M), llm.c on 8x A100 80GB SXM, bf16", "gpt", GPT2_SMALL_PARAMS, "amp-bf16", "mfu_datasheet",
              0.63, 0.63, _LLMC, "hand-written CUDA kernels, cuDNN attention, fused kernels, 8 GPUs; MFU is against "
              "each GPU's own dense bf16 peak",
              derived="10B tokens in about 90 minutes on 8 GPUs: about 231k tokens/s per A100 x 855.2M FLOPs a token "
                      "(6N + 12 L T d) = 198 TFLOP/s of the A100's 312"),
    Reference("GPT-2 (124M), nanoGPT on 8x A100 40GB, bf16", "gpt", GPT2_SMALL_PARAMS, "amp-bf16", "mfu_datasheet",
              0.23, 0.29, _NANOGPT, "torch.compile, 8 GPUs with gradient accumulation to 491,520 tokens a step; MFU "
              "is against each GPU's own dense bf16 peak",
              derived="600,000 steps of 491,520 tokens in \"about 4 days\" to \"~5 days\" on 8 GPUs: 85k-107k "
                      "tokens/s per A100 x 855.2M FLOPs a token = 73-91 TFLOP/s of the A100's 312"),
)


def on_terms(ref: Reference, row: pd.Series) -> bool:
    """Whether a config (a row of the aggregated frame) meets the reference's terms."""
    if row.get("status") != "ok" or row.get("workload") != ref.workload or row.get("precision") != ref.precision:
        return False
    if row.get("params") != ref.params:
        return False
    if ref.metric == "mfu_datasheet":
        return bool(pd.notna(row.get("mfu_datasheet")))
    sheet = datasheet_for(row.get("device_model") if pd.notna(row.get("device_model")) else None)
    return (sheet is not None and sheet.label == ref.gpu and str(row.get("device")).startswith("cuda")
            and row.get("parallelism") == "single" and row.get("batch_size") == ref.batch_size
            and (ref.memory_format is None or row.get("memory_format") == ref.memory_format)
            and pd.notna(row.get("throughput")))


def beside(configs: pd.DataFrame, multi_run: bool = False) -> pd.DataFrame:
    """One row per config and published figure on its terms: both figures, the ratio, what the
    terms were, what still differs and the source."""
    rows: list[dict[str, Any]] = []
    for _, row in configs.iterrows():
        for ref in REFERENCES:
            if not on_terms(ref, row):
                continue
            ours = float(row[ref.metric])
            mid = (ref.low + ref.high) / 2
            terms = (f"the same model, {ref.precision}; MFU of each GPU's datasheet peak"
                     if ref.metric == "mfu_datasheet" else
                     f"the same model on the same GPU ({ref.gpu}), {ref.precision}, batch {ref.batch_size}, "
                     f"{ref.memory_format}, one GPU")
            rows.append({**({"run": row["run"]} if multi_run else {}), "config": row["config_id"],
                         "published": ref.name,
                         "gpubench": fmt.pct(ours) if ref.metric == "mfu_datasheet" else f"{ours:,.0f} samples/s",
                         "figure": ref.figure(), "gpubench / published": f"{ours / mid:.2f}x", "on the terms": terms,
                         "differs": ref.differs + (f"; derived: {ref.derived}" if ref.derived else ""),
                         "source": ref.source})
    return pd.DataFrame(rows)


def reference_markdown() -> str:
    """The published runs and their terms, as the reference page shows them."""
    out = ["| published run | figure | model | terms | what differs | source |", "| --- " * 6 + "|"]
    for r in REFERENCES:
        terms = [f"`workload = \"{r.workload}\"` with {r.params:,} parameters", f"`precision = \"{r.precision}\"`"]
        if r.metric == "throughput":
            terms += [f"on a GPU of the `{r.gpu}` row", f"`batch_size = {r.batch_size}`",
                      f"`memory_format = \"{r.memory_format}\"`", "`parallelism = \"single\"`"]
        else:
            terms += ["on any GPU of the datasheet table (`mfu_datasheet`)"]
        figure = r.figure() + (" MFU (datasheet peak)" if r.metric == "mfu_datasheet" else " (one GPU)")
        out.append(f"| {r.name} | {figure} | {terms[0]} | {'; '.join(terms[1:])} | {r.differs}"
                   + (f"; derived: {r.derived}" if r.derived else "") + f" | {r.source} |")
    return "\n".join(out) + "\n"
