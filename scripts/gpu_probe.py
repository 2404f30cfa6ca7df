"""Two probes behind findings of the first H100 run (docs/gpu-validation.md), as they ran there
(`python3 scripts/gpu_probe.py` on the lent machine, about 10 s):

- an fp32 3x3 convolution (ResNet-50's third stage, channels-last) with cuDNN's TF32 allowed and
  not: counted by nominal FLOPs, both beat the H100's fp32 datasheet figure (66.9 TFLOP/s),
  because cuDNN picks TF32 tensor cores, or FFT/Winograd algorithms that do fewer operations;
- bf16 matrix products of three sizes timed over 10 and 100 back-to-back calls: a short burst
  against a sustained rate (the calibration reports sustained rates).

Plain ``perf_counter`` around a synchronised loop, as quick probes: the calibration
(``gpubench calibrate``) is the measurement gpubench uses."""

import time

import torch


def rate(fn, flops: float, iters: int) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return flops / ((time.perf_counter() - t) / iters) / 1e12


x = torch.randn(512, 256, 14, 14, device="cuda").to(memory_format=torch.channels_last)
w = torch.randn(256, 256, 3, 3, device="cuda").to(memory_format=torch.channels_last)
for tf32 in (True, False):
    torch.backends.cudnn.allow_tf32 = tf32
    conv = lambda: torch.nn.functional.conv2d(x, w, padding=1)  # noqa: E731
    for _ in range(3):
        conv()
    print("conv fp32 cudnn.allow_tf32", tf32, f"TFLOP/s {rate(conv, 2 * 512 * 256 * 256 * 9 * 14 * 14, 50):.1f}")
for n in (4096, 8192, 16384):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for iters in (10, 100):
        for _ in range(5):
            a @ b
        mm = lambda a=a, b=b: a @ b  # noqa: E731
        print("bf16 mm", n, "iters", iters, f"TFLOP/s {rate(mm, 2 * n**3, iters):.1f}")
