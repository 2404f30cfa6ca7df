"""Device peaks measured on this machine (``gpubench calibrate``): per precision, the best
FLOP/s of the frameworks' training kernels (matmul / linear and convolution), and memory-copy
bandwidth, cached per environment fingerprint, so that a result's MFU is against what this
device really does, not a datasheet figure it may never reach."""

# what a user is told to run when a result achieved more than its calibrated peak
RECALIBRATE = "gpubench calibrate --force"


def kernel_label(kernel: object) -> str:
    """``tensorflow matmul 1024x1024x1024``: the kernel that set a peak (``-``: not recorded)."""
    if not isinstance(kernel, dict):
        return "-"
    return " ".join(str(kernel[f]) for f in ("framework", "op", "shape") if kernel.get(f) is not None) or "-"
