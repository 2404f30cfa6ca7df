"""Multi-node runs: where this ``gpubench run`` sits among the nodes of one run.

One gpubench runs on every node, with the same suite and settings, so every node plans the
same configs in the same order. A distributed config starts N processes on every node and
meets the other nodes at a static rendezvous on ``master_addr:master_port``: torchrun's
(``--nnodes --node-rank --master-addr --master-port``) for PyTorch, gpubench.runner.tf_launch's
for TensorFlow's MultiWorkerMirroredStrategy. Ranks are numbered node by node: rank =
node_rank x N + local rank.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from gpubench.errors import InputError

DEFAULT_MASTER_PORT = 29500  # torchrun's default
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
            raise InputError(f"--node-rank: expected 0..{self.nnodes - 1} (--nnodes {self.nnodes}), got {self.node_rank}")
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

    def torchrun_args(self, nproc_per_node: int) -> list[str]:
        """torchrun's arguments: one node with a local rendezvous on a free port, or the
        static rendezvous on master_addr:master_port."""
        if not self.multi:
            return ["--standalone", "--nnodes=1", f"--nproc-per-node={nproc_per_node}"]
        return [f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}", f"--master-addr={self.master_addr}",
                f"--master-port={self.master_port}", f"--nproc-per-node={nproc_per_node}"]

    def launch_args(self) -> list[str]:
        """The same layout as flags of gpubench.runner.tf_launch."""
        if not self.multi:
            return []
        return [f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}", f"--master-addr={self.master_addr}",
                f"--master-port={self.master_port}"]

    def to_dict(self) -> dict[str, object]:
        return {"nnodes": self.nnodes, "node_rank": self.node_rank, "master_addr": self.master_addr,
                "master_port": self.master_port}


def _valid_host(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(_HOST_RE.match(text)) and len(text) <= 253
