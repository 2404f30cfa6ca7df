"""Multi-node runs: where this ``gpubench run`` sits among the nodes of one run.

One gpubench runs on every node, with the same suite and settings, so every node plans the
same configs in the same order. A distributed config starts N processes on every node and
meets the other nodes at a static rendezvous on ``master_addr:master_port``: torchrun's
(``--nnodes --node-rank --master-addr --master-port``) for PyTorch, gpubench.runner.ranks's
for TensorFlow's MultiWorkerMirroredStrategy. Ranks are numbered node by node: rank =
node_rank x N + local rank.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any

from gpubench.errors import InputError

DEFAULT_MASTER_PORT = 29500  # torchrun's default
RETRY_S = 0.5
_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Nodes:
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int = DEFAULT_MASTER_PORT

    @property
    def multi(self) -> bool:
        return self.nnodes > 1

    def check(self) -> Nodes:
        """Raise InputError (one line naming the flag) on an impossible layout; return self."""
        if self.nnodes < 1:
            raise InputError(f"--nnodes: expected an integer >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise InputError(f"--node-rank: expected 0..{self.nnodes - 1} (--nnodes {self.nnodes}), "
                             f"got {self.node_rank}")
        if not 1 <= self.master_port <= 65535:
            raise InputError(f"--master-port: expected a TCP port 1..65535, got {self.master_port}")
        if not self.multi:
            if self.master_addr is not None or self.master_port != DEFAULT_MASTER_PORT:
                raise InputError("--master-addr and --master-port are for multi-node runs; add --nnodes N (N >= 2), "
                                 "or leave them out")
            return self
        if not self.master_addr:
            raise InputError(f"--master-addr: required with --nnodes {self.nnodes}: the host name or address of "
                             "node 0, reachable from every node")
        if not _valid_host(self.master_addr):
            raise InputError(f"--master-addr: expected a host name or IP address, got {self.master_addr!r}")
        return self

    def node_launcher_args(self, nproc_per_node: int) -> list[str]:
        """A node launcher's arguments (torchrun's, gpubench.options.RankStart): one node with a
        local rendezvous on a free port, or the static rendezvous on master_addr:master_port."""
        if not self.multi:
            return ["--standalone", "--nnodes=1", f"--nproc-per-node={nproc_per_node}"]
        return [*self.launch_args(), f"--nproc-per-node={nproc_per_node}"]

    def launch_args(self) -> list[str]:
        """The node layout as flags, named alike by torchrun and gpubench.runner.ranks."""
        if not self.multi:
            return []
        return [f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}", f"--master-addr={self.master_addr}",
                f"--master-port={self.master_port}"]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class Skipped(RuntimeError):
    """The nodes are not at the same config (one of them skipped this one)."""


def _send(conn: socket.socket, obj: dict[str, Any], quiet: bool = False) -> None:
    """One JSON line; with ``quiet``, a peer that is gone is no error (it will come back)."""
    try:
        conn.sendall((json.dumps(obj) + "\n").encode())
    except OSError:
        if not quiet:
            raise


def _receive(conn: socket.socket) -> dict[str, Any] | None:
    """One JSON object line, or None for anything else (a closed or silent connection,
    another program)."""
    try:
        with conn.makefile("r", encoding="utf-8") as f:
            obj = json.loads(f.readline(65536))  # a barrier line is short; another program's may not be
    except (OSError, ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the other nodes did not arrive in time")
    return left


def meet(nodes: Nodes, job: str, index: int, payload: list[int], deadline: float | None = None
         ) -> list[tuple[str, list[int]]]:
    """Meet every other node at job ``job`` (the ``index``-th of the plan every node shares) on
    master_addr:master_port; every node's (address, payload), in node order. Node 0 listens;
    node r connects (retrying until node 0 listens, also while the port still belongs to the
    previous config's torchrun store) and sends its job and payload; node 0's address is
    master_addr, node r's the address its connection came from. Nodes at different jobs never
    pair: the one behind is told to skip its job (Skipped), the one ahead waits for it, and two
    different jobs at the same index both fail. TimeoutError past ``deadline`` (monotonic)."""
    hello = {"job": job, "index": index, "node_rank": nodes.node_rank, "payload": payload}
    if nodes.node_rank == 0:
        return _serve(nodes, hello, deadline)
    while True:
        left = _remaining(deadline)
        try:
            conn = socket.create_connection((nodes.master_addr, nodes.master_port), timeout=5.0)
        except OSError:  # node 0 does not listen yet
            time.sleep(RETRY_S)
            continue
        with conn:
            conn.settimeout(left)
            _send(conn, hello)
            answer = _receive(conn)
        if answer is None or "wait" in answer:  # not our rendezvous (yet), or node 0 is behind us
            time.sleep(RETRY_S)
            continue
        if "skip" in answer:
            raise Skipped(answer["skip"])
        return [(host, list(ports)) for host, ports in answer["nodes"]]


def _listen(port: int) -> socket.socket:
    """A server socket on every address of this node: IPv6 and IPv4 together where the system
    allows it (so master_addr may be either), else IPv4."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))


def _peer_host(peer: str) -> str:
    """The address a node connected from, as the other nodes should dial it: an IPv4 node seen
    through a dual-stack socket (``::ffff:10.0.0.2``) is ``10.0.0.2``."""
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0]) if ":" in peer else None
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    except ValueError:
        return peer
    return str(mapped) if mapped is not None else peer


def _serve(nodes: Nodes, hello: dict[str, Any], deadline: float | None) -> list[tuple[str, list[int]]]:
    assert nodes.master_addr is not None  # Nodes.check requires it of a multi-node run
    arrived: dict[int, tuple[str, list[int]]] = {0: (nodes.master_addr, hello["payload"])}
    waiting: list[socket.socket] = []
    try:
        with _listen(nodes.master_port) as server:
            while len(arrived) < nodes.nnodes:
                server.settimeout(_remaining(deadline))
                conn, (peer, *_) = server.accept()
                conn.settimeout(5.0)
                other = _receive(conn)
                rank = other.get("node_rank") if other else None
                if (other is None or not isinstance(rank, int) or rank not in range(1, nodes.nnodes) or rank in arrived
                        or not isinstance(other.get("index"), int)):
                    conn.close()  # a stray connection: not one of our nodes
                    continue
                behind = other["index"] < hello["index"]
                if behind or (other["index"] == hello["index"] and other["job"] != hello["job"]):
                    apart = f"node {rank} is at {other['job']!r}, node 0 at {hello['job']!r}"
                    _send(conn, {"skip": apart}, quiet=True)
                    conn.close()
                    if behind:  # node 0 skipped its job: that node fails it, node 0 waits on
                        continue
                    raise Skipped(apart)  # different jobs at the same place: both fail
                waiting.append(conn)
                if other["index"] > hello["index"]:  # it is ahead: it skipped this job
                    raise Skipped(f"node {rank} is at {other['job']!r}, past node 0's {hello['job']!r}")
                arrived[rank] = (_peer_host(peer), [int(p) for p in other["payload"]])
            everyone = [arrived[r] for r in range(nodes.nnodes)]
            for conn in waiting:
                _send(conn, {"nodes": everyone})
            for conn in waiting:
                _await_close(conn)
            return everyone
    except BaseException:
        for conn in waiting:  # come back later (they are ahead, or node 0 gave up on this job)
            _send(conn, {"wait": True}, quiet=True)
        raise
    finally:
        for conn in waiting:
            conn.close()


def _await_close(conn: socket.socket, timeout_s: float = 5.0) -> None:
    """Let the other node close the connection first: the side that closes first keeps the
    connection in TIME_WAIT, and that must not be master_port, which torchrun's store binds
    next."""
    try:
        conn.settimeout(timeout_s)
        while conn.recv(64):
            pass
    except OSError:
        pass


def barrier(nodes: Nodes, job: str, index: int, timeout_s: float) -> tuple[str, str] | None:
    """Before a distributed config: wait until every node is at it, so that each launcher's
    rendezvous finds the others there. None when they are, else the config's (status, reason)."""
    try:
        meet(nodes, job, index, [], time.monotonic() + timeout_s)
    except Skipped as e:
        return ("error", f"the nodes did not all run this config: {e} (are the nodes alike: frameworks, "
                         "GPUs, suite and settings?)")
    except TimeoutError:
        return ("timeout", f"not every node reached this config within {timeout_s:g} s (timeout_s)")
    return None


def _valid_host(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(_HOST_RE.match(text)) and len(text) <= 253
