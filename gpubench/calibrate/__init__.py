"""Device peaks measured on this machine (``gpubench calibrate``): dense matmul FLOP/s per
precision and memory-copy bandwidth, cached per environment fingerprint, so that a result's
MFU is against what this device really does, not a datasheet figure it may never reach."""
