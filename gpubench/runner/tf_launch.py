"""The launcher TensorFlow's MultiWorkerMirroredStrategy expects, which TensorFlow itself
does not ship: N worker processes on this node, each with its own ``TF_CONFIG`` (the
cluster's worker addresses, and its task index).

    python -m gpubench.runner.tf_launch --nproc-per-node N [--nnodes M --node-rank R
        --master-addr HOST --master-port P] WORKDIR

Each worker runs ``python -m gpubench.runner.worker WORKDIR`` with TF_CONFIG and the
variables torchrun sets (RANK = node_rank x N + local rank, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK), so the worker handles ranks the same way for every
launcher. Ports: each node picks N free ports of its own. On one node the cluster is
``localhost:<port>``; across nodes, node 0 listens on master_addr:master_port, every other
node connects and sends its ports (and the name of the job, WORKDIR's name, so that nodes
that drifted apart fail instead of pairing wrong configs), node 0 answers with the whole
worker list: node 0's workers at master_addr, node r's at the address its connection came
from. Like torchrun, a worker that fails stops the others, and the launcher exits with the
failed worker's code.
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

from gpubench.runner.nodes import DEFAULT_MASTER_PORT, Nodes

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


def _send(conn: socket.socket, obj: dict) -> None:
    conn.sendall((json.dumps(obj) + "\n").encode())


def _receive(conn: socket.socket) -> dict:
    with conn.makefile("r", encoding="utf-8") as f:
        line = f.readline()
    try:
        obj = json.loads(line)
    except ValueError:
        raise RuntimeError(f"rendezvous: unreadable message {line[:80]!r} (another program on the master port?)")
    if not isinstance(obj, dict):
        raise RuntimeError(f"rendezvous: unexpected message {line[:80]!r}")
    return obj


def _serve(nodes: Nodes, job: str, ports: list[int]) -> list[str]:
    """Node 0: collect every other node's ports, answer with the whole cluster."""
    hosts: dict[int, tuple[str, list[int]]] = {0: (nodes.master_addr, ports)}
    conns: list[socket.socket] = []
    with socket.create_server(("", nodes.master_port)) as server:
        try:
            while len(hosts) < nodes.nnodes:
                conn, (peer, *_) = server.accept()
                conns.append(conn)
                hello = _receive(conn)
                rank = hello.get("node_rank")
                problem = (f"node {rank} is at job {hello.get('job')!r}, node 0 at {job!r}" if hello.get("job") != job
                           else f"node rank {rank!r} twice or out of range" if rank in hosts or rank not in
                           range(nodes.nnodes) else None)
                if problem:
                    _send(conn, {"error": problem})
                    raise RuntimeError(f"rendezvous: {problem}")
                hosts[rank] = (peer, [int(p) for p in hello["ports"]])
            workers = [_address(hosts[r][0], port) for r in sorted(hosts) for port in hosts[r][1]]
            for conn in conns:
                _send(conn, {"workers": workers})
            return workers
        finally:
            for conn in conns:
                conn.close()


def _join(nodes: Nodes, job: str, ports: list[int]) -> list[str]:
    """Node r > 0: connect to node 0 (retrying until it listens), send our ports, get the cluster."""
    while True:
        try:
            conn = socket.create_connection((nodes.master_addr, nodes.master_port), timeout=5.0)
            break
        except OSError:
            time.sleep(0.5)
    with conn:
        conn.settimeout(None)
        _send(conn, {"job": job, "node_rank": nodes.node_rank, "ports": ports})
        answer = _receive(conn)
    if "error" in answer:
        raise RuntimeError(f"rendezvous: {answer['error']}")
    return list(answer["workers"])


def cluster(nodes: Nodes, job: str, nproc: int) -> list[str]:
    """Every worker's host:port, in rank order."""
    ports = free_ports(nproc)
    if not nodes.multi:
        return [_address("localhost", p) for p in ports]
    return (_serve if nodes.node_rank == 0 else _join)(nodes, job, ports)


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
                   LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK=str(nodes.node_rank),
                   TF_CONFIG=json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}))
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
    parser = argparse.ArgumentParser(prog="python -m gpubench.runner.tf_launch")
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
