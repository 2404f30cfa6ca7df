"""gpubench on a real Slurm: the throw-away cluster of scripts/slurm_cluster.py."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.slurm import slurm_cluster


@pytest.fixture(scope="module")
def cluster():
    yield from slurm_cluster()


def slurm(cluster, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, env={**os.environ, **cluster.env})


def job_state(cluster, job_id: str) -> dict[str, str]:
    out = slurm(cluster, "scontrol", "show", "job", "-o", job_id).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def test_the_test_cluster_runs_a_batch_job_with_a_step_and_refuses_an_unknown_partition(cluster, tmp_path):
    sub = slurm(cluster, "sbatch", "--parsable", "-o", str(tmp_path / "out.txt"), "--wrap",
                "echo on $SLURM_JOB_NODELIST; srun sh -c 'echo step $SLURM_STEP_ID'")
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while job_state(cluster, job_id).get("JobState") in ("PENDING", "RUNNING", "COMPLETING", None):
        assert time.monotonic() < deadline, cluster.log("slurmctld")
        time.sleep(0.3)
    state = job_state(cluster, job_id)
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0")
    assert (tmp_path / "out.txt").read_text().splitlines() == [f"on {cluster.name}", "step 0"]
    refused = slurm(cluster, "sbatch", "--parsable", "-p", "nope", "--wrap", "true")
    assert refused.returncode == 1 and "invalid partition specified: nope" in refused.stderr
