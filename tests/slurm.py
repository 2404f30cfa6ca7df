"""A throw-away two-node Slurm cluster on this host for the Slurm tests (scripts/slurm_cluster.py:
munged, slurmctld and two slurmd from the system's packages, configured in a temporary directory,
each slurmd in a network namespace of its own). Where Slurm is not installed, or the tests do
not run as root (slurmd switches to each job's user; network namespaces), the Slurm tests skip
with the reason, unless GPUBENCH_REQUIRE_SLURM=1 (set by .ci/run), which makes that a failure."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from slurm_cluster import SlurmCluster, missing, which  # noqa: E402 - scripts/ is not a package

REQUIRE = "GPUBENCH_REQUIRE_SLURM"


def slurm_cluster() -> Iterator[SlurmCluster]:
    gone = missing() + [b for b in ("ip", "nsenter", "unshare") if which(b) is None]
    reason = (f"Slurm is not installed (missing: {', '.join(gone)}): apt-get install slurm-wlm munge iproute2 "
              "util-linux" if gone else
              "the Slurm test cluster needs root (slurmd runs each job as its user; network namespaces)"
              if os.geteuid() != 0 else None)
    if reason:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1 and {reason}")
        pytest.skip(reason)
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="gpubench-slurm-")) / "cluster", nodes=2).start()
    try:
        yield cluster
    finally:
        cluster.stop()
