"""gpubench on a real Slurm: the throw-away cluster of scripts/slurm_cluster.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import plugin_env, result_lines, run_cli
from tests.slurm import REQUIRE, slurm_cluster
from tests.test_runner import FAULTS


@pytest.fixture(scope="module")
def cluster():
    yield from slurm_cluster()


def slurm(cluster, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, env={**os.environ, **cluster.env})


def job_state(cluster, job_id: str) -> dict[str, str]:
    out = slurm(cluster, "scontrol", "show", "job", "-o", job_id).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def test_the_test_cluster_has_two_nodes_that_a_job_spans_and_refuses_an_unknown_partition(cluster, tmp_path):
    sub = slurm(cluster, "sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", "-o", str(tmp_path / "out.txt"),
                "--wrap", "echo on $SLURM_JOB_NODELIST; srun sh -c 'echo step $SLURM_STEP_ID on $(hostname)'")
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while job_state(cluster, job_id).get("JobState") in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", None):
        assert time.monotonic() < deadline, cluster.log("slurmctld")
        time.sleep(0.3)
    state = job_state(cluster, job_id)
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0")
    first, *steps = (tmp_path / "out.txt").read_text().splitlines()
    assert first == "on node[1-2]" and sorted(steps) == ["step 0 on node1", "step 0 on node2"]  # two host names
    refused = slurm(cluster, "sbatch", "--parsable", "-p", "nope", "--wrap", "true")
    assert refused.returncode == 1 and "invalid partition specified: nope" in refused.stderr


def test_the_test_cluster_enforces_a_jobs_memory_limit(cluster):
    if not cluster.memory_limits:  # task/cgroup needs a writable cgroup v1 memory hierarchy
        reason = "this host has no writable cgroup v1 memory hierarchy: Slurm cannot enforce --mem here"
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1 and {reason}")
        pytest.skip(reason)
    assert "TaskPlugin=task/cgroup" in cluster.conf.read_text()


# the runner tests' suite of the fake backend's fault modes, with a time limit of one minute
SWEEP = FAULTS.replace("timeout_s = 20", "timeout_s = 50").replace("mode = [0, 1, 2, 3, 4, 5]", "mode = [0, 1, 2]")


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_gpubench_left():
    """A test that fails while a gpubench it started still runs must not leave it polling the
    shared cluster (its jobs would confuse the next tests)."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start(cluster, tmp_path, *args: str, sigint: bool = False, **env: str) -> subprocess.Popen:
    """gpubench in the background, its output (stdout and stderr) in one pipe. ``sigint``: with
    SIGINT at its default, as a terminal delivers it (a shell that starts a command in the
    background, as a CI script may have started these tests, makes its children ignore SIGINT)."""
    proc = subprocess.Popen([sys.executable, "-m", "gpubench", *args], cwd=tmp_path,
                            env=plugin_env(**cluster.env, **env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if sigint
                            else None)
    STARTED.append(proc)
    return proc


def gpubench(cluster, tmp_path, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return run_cli(list(args), cwd=tmp_path, env=plugin_env(**cluster.env, **env), timeout=timeout)


@pytest.mark.slow
def test_a_sweep_under_slurm_gives_results_and_slurms_outcomes(cluster, tmp_path, write_suite):
    # mode 0 trains, 1 raises as it is built, 2 hangs until Slurm's time limit (1 minute), 6 writes
    # 2 GiB, past the job's --mem (where the cluster enforces it: cgroups)
    modes = [0, 1, 2, 6] if cluster.memory_limits else [0, 1, 2]
    proc = gpubench(cluster, tmp_path, "run", str(write_suite(SWEEP.replace("[0, 1, 2]", str(modes)))),
                    "--launcher", "slurm", "--out", "my runs", "--no-report", "--max-parallel", "2",
                    "--sbatch-arg=--mem=600M")  # a blank in the run directory's path, as in a log's
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "my runs").iterdir()
    found = {r["config"]["workload_params"]["mode"]: r for r in result_lines(run_dir)}
    expected = {0: "ok", 1: "error", 2: "timeout", 6: "oom"}
    assert {m: r["status"] for m, r in found.items()} == {m: expected[m] for m in modes}
    assert found[0]["metrics"]["throughput"]["median"] > 0 and found[0]["runtime"]["slurm"]["state"] == "COMPLETED"
    assert "ValueError: injected failure in build" in found[1]["reason"]
    assert found[2]["reason"].startswith(f"Slurm job {found[2]['runtime']['slurm']['job_id']} ended TIMEOUT")
    assert "past its time limit" in found[2]["reason"]
    assert 60 <= found[2]["duration_s"] < 120  # Slurm's run time: the one-minute limit, no time in the queue
    # each result's fingerprint is the node's its job ran on (with the framework it ran), as is the run's
    assert found[0]["env"]["hostname"] in ("node1", "node2") and "fake" in found[0]["env"]["frameworks"]
    assert json.loads((run_dir / "run.json").read_text())["env"]["hostname"] in ("node1", "node2")
    if 6 in found:
        assert "out of memory (past the job's --mem); Slurm: " in found[6]["reason"], found[6]["reason"]
        assert re.search(r"oom-kill event|Out Of Memory", found[6]["reason"]), found[6]["reason"]
    script = (run_dir / "slurm" / "fault_mode0-fake-cpu-bs8-fp32-single-r0.sbatch").read_text()
    assert "#SBATCH --time=1\n" in script and "#SBATCH --nodes=1\n" in script and "#SBATCH --mem=600M\n" in script
    assert "srun --nodes=1 --ntasks-per-node=1 " in script and "-m gpubench.runner.worker" in script
    n = len(modes)
    counts = [tuple(map(int, m)) for m in re.findall(rf"slurm: (\d+) pending, (\d+) running, (\d+) finished of {n}",
                                                     proc.stdout)]
    assert counts[0][2] == 0 and sum(counts[0]) == n and counts[-1] == (0, 0, n), counts
    assert 1 <= max(r for _, r, _ in counts) <= 2, counts  # --max-parallel 2
    assert json.loads((run_dir / "run.json").read_text())["args"]["slurm"]["max_parallel"] == 2


@pytest.mark.slow
def test_a_cancelled_job_keeps_the_finished_results_and_resume_submits_only_it(cluster, tmp_path, write_suite):
    suite = write_suite(SWEEP.replace("mode = [0, 1, 2]", "batch_size = [4, 8]")
                        .replace("warmup_steps = 1", "warmup_steps = 0").replace("steps = 3", "steps = 1")
                        .replace("windows = 2", "windows = 1"))
    out = tmp_path / "runs"
    # the first run's steps take 3 s each (set when the jobs are submitted), so that one can be cancelled
    first = start(cluster, tmp_path, "run", str(suite), "--launcher", "slurm", "--out", str(out), "--no-report",
                  "--max-parallel", "1", FAKE_STEP_SLEEP_MS="3000")
    deadline = time.monotonic() + 60
    while "RUNNING" not in slurm(cluster, "squeue", "-h", "-o", "%T").stdout:
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.3)
    assert slurm(cluster, "scancel", "--name", "gpubench-fault_mode0-fake-cpu-bs4-fp32-single-r0").returncode == 0
    output, _ = first.communicate(timeout=120)
    assert first.returncode == 130, output
    assert "1 Slurm job(s) cancelled (scancel) without a result" in output and "--resume" in output
    (run_dir,) = out.iterdir()
    assert [r["config_id"] for r in result_lines(run_dir)] == ["fault_mode0-fake-cpu-bs8-fp32-single"]
    again = gpubench(cluster, tmp_path, "run", "--resume", str(run_dir), "--no-report")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 configs x 1 repeat(s), 1 to run" in again.stdout
    assert sorted(r["config_id"] for r in result_lines(run_dir)) == ["fault_mode0-fake-cpu-bs4-fp32-single",
                                                                     "fault_mode0-fake-cpu-bs8-fp32-single"]


def test_a_job_whose_node_fails_is_an_error_with_slurms_reason(cluster, tmp_path, write_suite):
    suite = write_suite(SWEEP.replace("mode = [0, 1, 2]", "mode = [2]"))  # hangs until its node goes down
    # --no-requeue: by default Slurm puts a job whose node failed back in the queue, to run again
    proc = start(cluster, tmp_path, "run", str(suite), "--launcher", "slurm", "--out", str(tmp_path / "runs"),
                 "--no-report", "--sbatch-arg=--no-requeue")
    deadline = time.monotonic() + 60
    while not (running := slurm(cluster, "squeue", "-h", "-t", "RUNNING", "-o", "%N").stdout.strip()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.3)
    try:
        assert slurm(cluster, "scontrol", "update", f"nodename={running}", "state=down",
                     "reason=test: node lost").returncode == 0
        output, _ = proc.communicate(timeout=60)
    finally:
        slurm(cluster, "scontrol", "update", f"nodename={running}", "state=resume")
    assert proc.returncode == 1, output
    (run_dir,) = (tmp_path / "runs").iterdir()
    (r,) = result_lines(run_dir)
    assert r["status"] == "error" and r["runtime"]["slurm"]["state"] == "NODE_FAIL", r["reason"]
    assert r["reason"].startswith(f"Slurm job {r['runtime']['slurm']['job_id']} ended NODE_FAIL"), r["reason"]


def test_ctrl_c_cancels_the_sweeps_jobs_and_keeps_the_finished_results(cluster, tmp_path, write_suite):
    suite = write_suite(SWEEP.replace("mode = [0, 1, 2]", "mode = [0, 2]"))  # one trains, one hangs
    proc = start(cluster, tmp_path, "run", str(suite), "--launcher", "slurm", "--out", str(tmp_path / "runs"),
                 "--no-report", sigint=True)
    deadline = time.monotonic() + 90
    while not [r for d in (tmp_path / "runs").glob("*") for r in result_lines(d)]:  # the first result is in
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.3)
    assert "RUNNING" in slurm(cluster, "squeue", "-h", "-o", "%T").stdout  # the hanging one
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "gpubench: interrupted; finished configs are in" in output, output
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert [r["status"] for r in result_lines(run_dir)] == ["ok"]
    deadline = time.monotonic() + 30
    while slurm(cluster, "squeue", "-h").stdout.strip():  # scancel'ed: gone from the queue
        assert time.monotonic() < deadline, slurm(cluster, "squeue").stdout
        time.sleep(0.3)


@pytest.mark.parametrize("args, message", [
    (["--launcher", "slurm", "--partition", "nope"],
     "--launcher slurm: Slurm refused the job (invalid partition specified: nope; "),
    (["--partition", "gpu"], "--partition: Slurm options need --launcher slurm"),
    (["--launcher", "slurm", "--nnodes", "2", "--master-addr", "node1"],
     "--master-addr: not with --launcher slurm (Slurm places the nodes; give --nnodes N"),
    (["--launcher", "slurm", "--nnodes", "3", "--set", "parallelism=multiworker:1"],
     "--launcher slurm: Slurm refused the job (allocation failure: Requested node configuration is not available"),
    (["--launcher", "slurm", "--set", "batch_size=max"], '--launcher slurm: batch_size "max" is searched on'),
    (["--launcher", "slurm", "--set", "device=cuda:1"], "--launcher slurm: device: a numbered GPU (fault_mode0-"),
    (["--launcher", "slurm", "--out", 'a"b'], '--launcher slurm: a"b: a path with a double quote or a backslash'),
])
def test_a_refused_submission_is_one_line_before_anything_runs(cluster, tmp_path, write_suite, args, message):
    proc = gpubench(cluster, tmp_path, "run", str(write_suite(SWEEP)), "--out", "runs", *args)
    assert proc.returncode == 2 and proc.stderr.startswith(f"gpubench: error: {message}"), proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "runs").exists()
    assert slurm(cluster, "squeue", "-h").stdout.strip() == ""


# an MLP small enough that a distributed config's job takes seconds
TINY_MLP = """
name = "tiny"
[defaults]
workload = "mlp"
depth = 1
width = 32
batch_size = 8
warmup_steps = 1
steps = 2
windows = 1
telemetry_interval_ms = 0
"""


@pytest.mark.slow
def test_a_ddp_config_runs_its_ranks_in_one_slurm_job(cluster, tmp_path, write_suite):
    pytest.importorskip("torch")
    suite = write_suite(TINY_MLP.replace("tiny", "slurmddp") + 'parallelism = "ddp:2"\n')
    db = str(tmp_path / "history.db")
    proc = gpubench(cluster, tmp_path, "run", str(suite), "--launcher", "slurm", "--out", "runs", "--no-report",
                    "--db", db)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    (r,) = result_lines(run_dir)
    listed = gpubench(cluster, tmp_path, "history", "list", "--db", db)  # recorded as the job ended
    assert listed.returncode == 0 and "1 run(s)" in listed.stdout and run_dir.name in listed.stdout, listed.stdout
    assert "1/1" in listed.stdout
    assert r["status"] == "ok" and r["runtime"]["distributed"].startswith("DistributedDataParallel(gloo, world_size=2")
    assert r["env"]["hostname"] in ("node1", "node2") and r["env"]["frameworks"]["torch"]["available"]
    on_node = gpubench(cluster, tmp_path, "history", "list", "--db", db, "--machine", r["env"]["hostname"])
    assert on_node.returncode == 0 and run_dir.name in on_node.stdout, on_node.stdout  # the node's machine
    script = (run_dir / "slurm" / f"{r['config_id']}-r0.sbatch").read_text()
    assert "-m torch.distributed.run" in script and "--gpus-per-node" not in script  # a CPU config asks for no GPU


def test_a_run_with_no_job_is_still_recorded_into_the_history(cluster, tmp_path, write_suite):
    # a single-process config cannot span nodes: recorded unsupported without a job, so no node's
    # worker tells the run's fingerprint; the history gets the run at its end all the same
    db = str(tmp_path / "history.db")
    proc = gpubench(cluster, tmp_path, "run", str(write_suite(TINY_MLP)), "--launcher", "slurm", "--nnodes", "2",
                    "--out", "runs", "--no-report", "--db", db)
    assert proc.returncode == 1 and "nothing was measured: unsupported x1" in proc.stdout, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert [r["status"] for r in result_lines(run_dir)] == ["unsupported"]
    listed = gpubench(cluster, tmp_path, "history", "list", "--db", db)
    assert listed.returncode == 0 and run_dir.name in listed.stdout and "0/1" in listed.stdout, listed.stdout


@pytest.mark.slow
def test_distributed_configs_span_two_nodes_in_one_slurm_job_each(cluster, tmp_path, write_suite):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    suite = write_suite(TINY_MLP.replace("tiny", "slurmnodes") + """
[[matrix.include]]
framework = "torch"
parallelism = "ddp:1"
[[matrix.include]]
framework = "torch"
parallelism = "fsdp:2"
[[matrix.include]]
framework = "tensorflow"
parallelism = "multiworker:1"
""")
    # one job at a time: the two-node jobs would otherwise share the two nodes, four ranks on a
    # 2-core host beside the other tests
    proc = gpubench(cluster, tmp_path, "run", str(suite), "--launcher", "slurm", "--nnodes", "2", "--out", "runs",
                    "--no-report", "--max-parallel", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    found = {r["config"]["parallelism"]: r for r in result_lines(run_dir)}
    # the suite's base config (single) cannot span nodes: unsupported, without a Slurm job
    assert {p: r["status"] for p, r in found.items()} == {"single": "unsupported", "ddp:1": "ok", "fsdp:2": "ok",
                                                         "multiworker:1": "ok"}
    assert "runs distributed configs only" in found.pop("single")["reason"]
    assert len(list((run_dir / "slurm").glob("*.sbatch"))) == 3
    # fsdp:2 across the two nodes: two ranks on each, one FSDP group of four; each rank holds its
    # shard (dimension 0) of the state that DDP's ranks each hold whole: together, the whole, but
    # for Adam's step counts (a 4-byte scalar per parameter tensor, 4 here), which every rank keeps
    fsdp = found.pop("fsdp:2")
    assert [(x["rank"], x["node"], x["host"]) for x in fsdp["metrics"]["ranks"]] == [
        (0, 0, "node1"), (1, 0, "node1"), (2, 1, "node2"), (3, 1, "node2")]
    assert fsdp["runtime"]["distributed"] == "fully_shard(gloo, world_size=4)"
    assert fsdp["metrics"]["nodes"] == 2 and fsdp["config_id"].endswith("-nnodes=2")
    whole = found["ddp:1"]["metrics"]["memory"]["state_bytes_per_device"]
    shards = [x["state_bytes_per_device"] for x in fsdp["metrics"]["ranks"]]
    assert sum(shards) - whole == 3 * 4 * 4 and max(shards) < whole / 4 + 1024, (shards, whole)
    for r in found.values():  # one rank on each node, each on its own host
        assert [(x["rank"], x["node"], x["host"]) for x in r["metrics"]["ranks"]] == [(0, 0, "node1"), (1, 1, "node2")]
        assert r["metrics"]["nodes"] == 2 and r["config_id"].endswith("-nnodes=2")
    found = {r["config"]["framework"]: r for r in found.values()}
    assert found["torch"]["runtime"]["distributed"].startswith("DistributedDataParallel(gloo, world_size=2")
    assert found["tensorflow"]["runtime"]["distributed"] == (
        "MultiWorkerMirroredStrategy(RING, workers=2, cluster=SlurmClusterResolver)")
    script = (run_dir / "slurm" / f"{found['torch']['config_id']}-r0.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in script and "--rdzv-backend=c10d" in script
    assert json.loads((run_dir / "run.json").read_text())["args"]["slurm"]["nodes"] == 2
    # a resume of it keeps --nnodes, so its configs have the ids its results carry: nothing to run
    again = gpubench(cluster, tmp_path, "run", "--resume", str(run_dir), "--no-report")
    assert again.returncode == 0 and "0 to run" in again.stdout, again.stdout + again.stderr


def test_the_batch_script_asks_for_what_the_config_needs(tmp_path):
    from gpubench.config import Config
    from gpubench.errors import InputError
    from gpubench.launch import Interpreter
    from gpubench.runner.job import Job
    from gpubench.runner.slurm import SlurmOptions, batch_script

    def script(config, **options):
        return batch_script(Job(config, 0), tmp_path / "w", tmp_path / "l.log", Interpreter(), SlurmOptions(**options))

    ddp = script(Config(workload="mlp", device="cuda", parallelism="ddp:4", timeout_s=150, huge_pages="transparent"))
    assert "#SBATCH --gpus-per-node=4\n" in ddp and "#SBATCH --time=3\n" in ddp  # 150 s -> 3 minutes
    assert "export THP_MEM_ALLOC_ENABLE=1\n" in ddp and "--nproc-per-node=4" in ddp
    single = script(Config(workload="mlp", device="cuda"), partition="gpu", account="lab", time="0:30:00",
                    sbatch_args=("--qos=high", "--exclusive"))
    assert "#SBATCH --gpus-per-node=1\n" in single and "#SBATCH --time=0:30:00\n" in single
    assert "#SBATCH --partition=gpu\n#SBATCH --account=lab\n#SBATCH --qos=high\n#SBATCH --exclusive\n" in single
    assert "--gpus-per-node" not in script(Config(workload="mlp", device="cpu"))
    assert "#SBATCH --gpus-per-node=8\n" in script(Config(workload="mlp", device="cuda"), gpus_per_node=8)
    # ddp:4 on each of 2 nodes: one torchrun per node, meeting at the first node's c10d rendezvous
    two = script(Config(workload="mlp", device="cuda", parallelism="ddp:4", nnodes=2))
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=4\n" in two
    assert "#SBATCH --gpus-per-node=4\n" in two
    assert "srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=$SLURM_CPUS_PER_TASK " in two  # or --sbatch-arg's
    assert 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in two
    assert ("-m torch.distributed.run --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d "
            "--rdzv-id=gpubench-$SLURM_JOB_ID --rdzv-endpoint=$head:$port -m gpubench.runner.worker") in two
    # multiworker:2 on each of 2 nodes: 2 tasks a node, each a worker; TensorFlow's SlurmClusterResolver
    tf = script(Config(workload="mlp", framework="tensorflow", parallelism="multiworker:2", nnodes=2))
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=1\n" in tf
    assert "export GPUBENCH_TF_CLUSTER=slurm " in tf and "tf_launch" not in tf
    assert ("srun --nodes=2 --ntasks-per-node=2 --cpus-per-task=$SLURM_CPUS_PER_TASK --distribution=block "
            "--kill-on-bad-exit=1 ") in tf
    # paths are quoted for the shell (a $ in one is not expanded) and for sbatch, a % in the log escaped
    odd = batch_script(Job(Config(workload="mlp", parallelism="ddp:1", nnodes=2), 0), tmp_path / "a $b",
                       tmp_path / "my runs" / "50%.log", Interpreter(), SlurmOptions())
    assert f"'{tmp_path}/a $b'" in odd and f'--output="{tmp_path}/my runs/50%%.log"\n' in odd
    with pytest.raises(InputError, match="double quote"):
        batch_script(Job(Config(workload="mlp"), 0), tmp_path, tmp_path / 'a"b.log', Interpreter(), SlurmOptions())
    assert f"rm -f '{tmp_path}/a $b'/result*.json" in odd  # a requeued job's first outcomes go
    # a single-process config in a multi-node run asks for one node (its worker says unsupported)
    assert "#SBATCH --nodes=1\n" in script(Config(workload="mlp", nnodes=2))


def test_slurm_ranks_are_torchruns_variables_from_a_slurm_tasks():
    from gpubench.runner.slurm import slurm_ranks

    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NNODES": "2", "SLURM_NODEID": "1"}
    assert slurm_ranks(env) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                                "GROUP_RANK": "1"}
    assert slurm_ranks({**env, "SLURM_NTASKS_PER_NODE": "2"})["LOCAL_WORLD_SIZE"] == "2"
    # nodes gpu9, gpu10 (Slurm's order): numbered as TensorFlow's resolver lists them, gpu10 first
    hosts = {**env, "SLURM_NODEID": "0", "GPUBENCH_SLURM_HOSTS": "gpu9,gpu10"}
    assert (slurm_ranks(hosts)["RANK"], slurm_ranks(hosts)["GROUP_RANK"]) == ("3", "1")


def test_tensorflows_slurm_resolver_puts_each_worker_at_its_own_address(monkeypatch):
    pytest.importorskip("tensorflow")
    from gpubench.backends.tensorflow.trainer import _SlurmResolver
    from gpubench.runner.slurm import slurm_ranks

    # task 0 (SLURM_PROCID) runs on gpu9, the first node in Slurm's order and the last as text
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NNODES": "2", "SLURM_NODEID": "0",
           "SLURM_STEP_NODELIST": "gpu[9-10]", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
           "GPUBENCH_SLURM_HOSTS": "gpu9,gpu10"}
    for key, value in {**env, **slurm_ranks(env)}.items():
        monkeypatch.setenv(key, value)
    resolver = _SlurmResolver(port_base=20000, gpus_per_node=1, gpus_per_task=1, auto_set_gpu=False)
    assert resolver.cluster_spec().task_address("worker", resolver.task_id) == "gpu9:20000"


def test_a_node_whose_fingerprint_fails_keeps_its_outcome(monkeypatch):
    import socket

    from gpubench.runner import probe, worker

    pytest.importorskip("torch")
    env = worker._node_env("torch")  # the fingerprint, with the framework's probe
    assert env["hostname"] == socket.gethostname() and env["frameworks"]["torch"]["available"]

    def broken(name):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(probe, "probe_here", broken)
    assert worker._node_env("torch") == {"hostname": socket.gethostname(),
                                         "fingerprint_error": "RuntimeError: CUDA error: an illegal memory access was "
                                                              "encountered"}


# --- every measuring command under --launcher slurm (gpubench.runner.session) -------------

ONE_FAKE = SWEEP.replace("mode = [0, 1, 2]", "mode = [0]")


def slurm_jobs_of(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "slurm").iterdir())


@pytest.mark.slow
def test_find_batch_probes_as_slurm_jobs(cluster, tmp_path, write_suite):
    proc = gpubench(cluster, tmp_path, "find-batch", str(write_suite(ONE_FAKE)), "--launcher", "slurm",
                    "--out", "runs", "--json", "fb.json", FAKE_MAX_BATCH="12")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (s,) = json.loads((tmp_path / "fb.json").read_text())
    assert (s["max_batch"], s["first_oom"]) == (12, 13)
    assert [p["batch_size"] for p in s["probes"]] == [8, 16, 12, 14, 13]
    (run_dir,) = (tmp_path / "runs").iterdir()
    probes = result_lines(run_dir)  # each probe a result of the run directory, from its Slurm job on a node
    assert [r["config"]["batch_size"] for r in probes] == [8, 16, 12, 14, 13]
    assert all(r["runtime"]["slurm"]["state"] == "COMPLETED" and r["env"]["hostname"] in ("node1", "node2")
               for r in probes)
    assert len(slurm_jobs_of(run_dir)) == 5


def test_a_lockstep_ab_under_slurm_is_refused_in_one_line(cluster, tmp_path, write_suite):
    proc = gpubench(cluster, tmp_path, "ab", str(write_suite(ONE_FAKE)), "--launcher", "slurm", "--lockstep",
                    "--out", "runs")
    assert proc.returncode == 2 and proc.stderr.startswith(
        "gpubench: error: --lockstep with --launcher slurm: the two sides of a lockstep round take turns on one "
        "machine"), proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_ab_alternates_its_sides_as_slurm_jobs(cluster, tmp_path, write_suite):
    suite = str(write_suite(ONE_FAKE))
    proc = gpubench(cluster, tmp_path, "ab", suite, "--launcher", "slurm", "--out", "runs", "--repeats", "3",
                    "--alpha", "0.2", "--threshold", "50%", "--no-report", "--json", "ab.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdicts = json.loads((tmp_path / "ab.json").read_text())
    # an A/A: never a change (three repeats a side on a busy machine may leave it undecided)
    assert [v["verdict"] for v in verdicts["verdicts"]] in (["unchanged"], ["inconclusive"]) and not verdicts["failed"]
    job_ids = {}
    for side in ("baseline", "candidate"):
        run_dir = Path(verdicts[side])
        results = result_lines(run_dir)
        assert all(r["runtime"]["slurm"]["state"] == "COMPLETED" for r in results)
        job_ids[side] = {r["repeat"]: int(r["runtime"]["slurm"]["job_id"]) for r in results}
        assert json.loads((run_dir / "run.json").read_text())["args"]["slurm"]["nodes"] == 1
        assert len(slurm_jobs_of(run_dir)) == 3
    # one job at a time, A B, then B A, then A B: Slurm numbered them in that order
    order = sorted((job_ids[side][k], side[0]) for side in job_ids for k in job_ids[side])
    assert "".join(side for _, side in order) == "bccbbc", order


@pytest.mark.slow
def test_advise_measures_its_practices_as_slurm_jobs(cluster, tmp_path):
    from tests.test_advise import SUITE as ADVISE_SUITE

    (tmp_path / "s.toml").write_text(ADVISE_SUITE)
    proc = gpubench(cluster, tmp_path, "advise", "s.toml", "--launcher", "slurm", "--only", "precision",
                    "--budget", "120", "--threshold", "10%", "--no-report", timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    advice = json.loads((run_dir / "advice.json").read_text())
    assert {r["practice"] for r in advice["rows"]} and all(r["verdict"] for r in advice["rows"])
    results = result_lines(run_dir)
    assert len({r["config_id"] for r in results}) >= 2  # the baseline and a practice, each from its Slurm jobs
    assert all(r["runtime"]["slurm"]["state"] == "COMPLETED" for r in results)
    assert json.loads((run_dir / "run.json").read_text())["args"]["slurm"]["max_parallel"] == 0


@pytest.mark.slow
def test_profile_runs_its_profiler_in_a_slurm_job(cluster, tmp_path, write_suite):
    pytest.importorskip("torch")
    suite = write_suite(TINY_MLP.replace("tiny", "slurmprof") + 'framework = "torch"\ndevice = "cpu"\n')
    proc = gpubench(cluster, tmp_path, "profile", str(suite), "--launcher", "slurm", "--steps", "2", "--out", "runs",
                    "--no-report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    (r,) = result_lines(run_dir)
    assert r["runtime"]["slurm"]["state"] == "COMPLETED" and r["env"]["hostname"] in ("node1", "node2")
    assert r["profile"]["files"] and all((run_dir / rel).is_file() for rel in r["profile"]["files"].values())
    assert r["metrics"]["breakdown"]["step_ms"] > 0
