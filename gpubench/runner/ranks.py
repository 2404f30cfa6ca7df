"""gpubench's launcher for a distributed kind whose every rank is a process of its own, for
the backends that declare it (a ``RankStart`` without a node launcher in their capabilities; TensorFlow's
multiworker:N, whose MultiWorkerMirroredStrategy has no launcher of its own): N worker
processes on this node, each with the variables torchrun sets and every worker's address.

    python -m gpubench.runner.ranks --nproc-per-node N [--nnodes M --node-rank R
        --master-addr HOST --master-port P] WORKDIR

Each worker runs ``python -m gpubench.runner.worker WORKDIR`` with RANK = node_rank x N +
local rank, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (so the worker handles ranks
the same way for every launcher) and GPUBENCH_WORKERS, every worker's host:port in rank order
as a JSON list (from which the TensorFlow backend makes the worker's TF_CONFIG). Ports: each
node picks N free ports of its own. On one node the cluster is ``localhost:<port>``; across
nodes, node 0 listens on master_addr:master_port, every other node connects and sends its
ports (and the name of the job, WORKDIR's name, so that nodes at different configs fail
instead of pairing wrong workers), node 0 answers with the whole worker list: node 0's
workers at master_addr, node r's at the address its connection came from. Like torchrun, a
worker that fails stops the others, and the launcher exits with the failed worker's code.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gpubench.launch import WORKERS_ENV
from gpubench.runner.nodes import DEFAULT_MASTER_PORT, Nodes, meet

POLL_S = 0.1
GRACE_S = 5.0


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports free on this node now (all held open together while picking)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def cluster(nodes: Nodes, job: str, nproc: int) -> list[str]:
    """Every worker's host:port, in rank order: this node's free ports, or across nodes the
    ports every node sent to node 0's rendezvous (gpubench.runner.nodes.meet)."""
    ports = free_ports(nproc)
    if not nodes.multi:
        return [_address("localhost", p) for p in ports]
    return [_address(host, port) for host, node_ports in meet(nodes, job, 0, ports) for port in node_ports]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(nodes: Nodes, nproc: int, workdir: Path) -> int:
    workers = cluster(nodes, workdir.name, nproc)
    procs: list[subprocess.Popen] = []

    def on_signal(signum: int, _frame: object) -> None:
        _stop(procs)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for local in range(nproc):
        rank = nodes.node_rank * nproc + local
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(local), WORLD_SIZE=str(len(workers)),
                   LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK=str(nodes.node_rank), **{WORKERS_ENV: json.dumps(workers)})
        procs.append(subprocess.Popen([sys.executable, "-m", "gpubench.runner.worker", str(workdir)], env=env))
    while True:
        codes = [p.poll() for p in procs]
        failed = next((c for c in codes if c not in (None, 0)), None)
        if failed is not None:  # like torchrun: one failed worker stops the rest
            _stop(procs)
            return failed if failed > 0 else 128 - failed
        if all(c == 0 for c in codes):
            return 0
        time.sleep(POLL_S)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpubench.runner.ranks")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr")
    parser.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT)
    parser.add_argument("workdir", type=Path)
    args = parser.parse_args(argv)
    nodes = Nodes(args.nnodes, args.node_rank, args.master_addr, args.master_port)
    return launch(nodes, args.nproc_per_node, args.workdir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
