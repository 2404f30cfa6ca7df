"""Importing TensorFlow and naming its devices: shared by the backend, the trainer and the
calibration's TensorFlow child (importing this module does not import TensorFlow)."""

from __future__ import annotations

import os
from types import ModuleType

from gpubench.options import device_index, device_kind

# a multiworker worker that srun started (gpubench run --launcher slurm): "slurm" in the first,
# and the first of the job's worker ports (one per task on a node) in the second
SLURM_CLUSTER_ENV = "GPUBENCH_TF_CLUSTER"
PORT_BASE_ENV = "GPUBENCH_TF_PORT_BASE"


def import_tf() -> ModuleType:
    """Import TensorFlow quietly, with GPU memory growth on: TensorFlow would otherwise
    reserve almost all of every visible GPU's memory at start-up."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # already initialised in this process: growth was set before
            pass
    return tf


def tf_device(device: str) -> str:
    """gpubench's device name as a TensorFlow device: cpu -> /CPU:0, cuda[:N] -> /GPU:N."""
    return f"/GPU:{device_index(device)}" if device_kind(device) == "cuda" else "/CPU:0"
