"""Probe NVML's GPU Performance Monitoring (GPM) metrics on the GPU at hand (Hopper and later).

    python3 scripts/gpm_probe.py [--json FILE]

Reads each GPM metric over two windows: the GPU idle for one second, then busy with a bf16
matrix-multiply loop in PyTorch for about two seconds. Prints, per metric, the value in each
window, or the NVML error where the driver refuses it. Nothing is written to the GPU's settings.
This is the ground truth for the counters gpubench records (which metrics a driver serves, and
whether they move with the work); it needs a GPU, nvidia-ml-py and PyTorch with CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

METRICS = {
    "graphics_util": 1,
    "sm_util": 2,
    "sm_occupancy": 3,
    "any_tensor_util": 5,
    "hmma_tensor_util": 7,
    "dram_bw_util": 10,
    "fp32_util": 12,
    "fp16_util": 13,
    "pcie_tx_mib_s": 20,
    "pcie_rx_mib_s": 21,
    "nvlink_rx_mib_s": 60,
    "nvlink_tx_mib_s": 61,
}


def window(pynvml, handle, work) -> dict:
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    try:
        pynvml.nvmlGpmSampleGet(handle, first)
        start = time.perf_counter()
        work()
        seconds = time.perf_counter() - start
        pynvml.nvmlGpmSampleGet(handle, second)
        get = pynvml.c_nvmlGpmMetricsGet_t()
        get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(METRICS)
        get.sample1, get.sample2 = first, second
        for i, metric_id in enumerate(METRICS.values()):
            get.metrics[i].metricId = metric_id
        pynvml.nvmlGpmMetricsGet(get)
        out: dict = {"seconds": round(seconds, 3)}
        for i, name in enumerate(METRICS):
            m = get.metrics[i]
            out[name] = round(m.value, 3) if m.nvmlReturn == 0 else f"nvml error {m.nvmlReturn}"
        return out
    finally:
        pynvml.nvmlGpmSampleFree(first)
        pynvml.nvmlGpmSampleFree(second)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    result: dict = {"gpu": pynvml.nvmlDeviceGetName(handle), "driver": pynvml.nvmlSystemGetDriverVersion()}
    try:
        support = pynvml.nvmlGpmQueryDeviceSupport(handle)
        result["supported"] = bool(support.isSupportedDevice)
    except pynvml.NVMLError as exc:
        result["supported"] = False
        result["reason"] = f"nvmlGpmQueryDeviceSupport: {exc}"
    if result["supported"]:
        import torch

        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()

        def busy() -> None:
            end = time.perf_counter() + 2.0
            n = 0
            while time.perf_counter() < end:
                for _ in range(20):
                    a @ b
                torch.cuda.synchronize()
                n += 20
            result["busy_matmuls"] = n

        try:
            result["idle"] = window(pynvml, handle, lambda: time.sleep(1.0))
            result["busy_bf16_matmul"] = window(pynvml, handle, busy)
        except pynvml.NVMLError as exc:
            result["reason"] = f"GPM sampling: {exc}"
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
