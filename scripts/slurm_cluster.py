"""A throw-away Slurm cluster on this host from the system's packages, for gpubench's tests.

    python scripts/slurm_cluster.py start DIR [--nodes N]   # prints: export SLURM_CONF=DIR/slurm.conf
    python scripts/slurm_cluster.py stop DIR

Starts munged (with a fresh key), slurmctld and N slurmd (node1..nodeN), all configured in DIR
(which must not exist, or be empty) on free ports, as the user running it (root: slurmd runs
each job as the user who submitted it, and only root can switch users). No accounting
database: jobs are tracked with proctrack/linuxproc, and finished jobs stay known to
``scontrol show job`` for an hour (MinJobAge). Where the host has a writable cgroup v1 memory
hierarchy, memory is a scheduled resource (DefMemPerCPU: a CPU's share of the node) and
task/cgroup enforces each job's ``--mem``: past it the kernel kills the job's processes, as on
a real cluster. ``apt-get install slurm-wlm munge`` provides
the binaries; ``missing()`` says which are not there.

With one node, everything listens on 127.0.0.1. With N >= 2, each slurmd runs in a network
namespace of its own (``ip netns``), with its own host name (a UTS namespace: ``nodeK``) and
address on a bridge (``10.X.Y.1`` is slurmctld's, ``10.X.Y.(10+K)`` node K's); an
``/etc/netns/<ns>/hosts`` file names every node, so jobs see N machines that reach each other
over a network, as on a real cluster, and a job spanning nodes really does.
"""

from __future__ import annotations

import json
import os
import pwd
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")


def which(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in SBIN:
        if os.access(Path(d) / name, os.X_OK):
            return str(Path(d) / name)
    return None


def missing() -> list[str]:
    """The binaries this needs that are not installed."""
    return [b for b in BINARIES if which(b) is None]


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 * 9 // 10
    return 1024


CGROUP_V1 = Path("/sys/fs/cgroup")


def memory_cgroup() -> bool:
    """Whether slurmd can put jobs in memory cgroups here (cgroup v1, writable): then a job's
    ``--mem`` is enforced by the kernel, and a job past it ends out of memory."""
    memory = CGROUP_V1 / "memory"
    return (memory / "memory.limit_in_bytes").exists() and os.access(memory, os.W_OK)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(which("ip") or "ip"), *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


class SlurmCluster:
    """One slurmctld and ``nodes`` slurmd (node1..nodeN) on this host, configured in ``root``."""

    def __init__(self, root: Path, nodes: int = 1) -> None:
        self.root = Path(root).resolve()
        self.nodes = nodes
        self.names = [f"node{k}" for k in range(1, nodes + 1)]
        self.name = self.names[0]
        self.conf = self.root / "slurm.conf"
        self.user = pwd.getpwuid(os.getuid()).pw_name
        # memory limits (task/cgroup) where this host has a writable cgroup v1 memory hierarchy
        self.memory_limits = memory_cgroup()
        self.net = self.root / "network.json"  # the bridge's, namespaces' and veths' names, for stop()

    @property
    def env(self) -> dict[str, str]:
        """The variables that point Slurm's commands at this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def _write_conf(self, ctld_addr: str, node_addrs: list[str]) -> None:
        ctld, slurmd = _free_ports(2)
        cpus = os.cpu_count() or 1
        for d in ("state", "spool", "munge"):
            (self.root / d).mkdir(mode=0o700, exist_ok=True)
        r = self.root
        if self.nodes == 1:
            nodes = (f"NodeName={self.name} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 CPUs={cpus} "
                     f"RealMemory={_memory_mb()} State=UNKNOWN")
        else:
            nodes = "\n".join(f"NodeName={n} NodeHostname={n} NodeAddr={a} CPUs={cpus} RealMemory={_memory_mb()} "
                              "State=UNKNOWN" for n, a in zip(self.names, node_addrs))
        if self.memory_limits:  # a job's --mem is its cgroup's limit; past it the kernel kills it (OUT_OF_MEMORY)
            (self.root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n"
                                                   "ConstrainRAMSpace=yes\nConstrainSwapSpace=yes\n"
                                                   "AllowedSwapSpace=0\n")
        self.conf.write_text(f"""\
ClusterName=gpubenchtest
SlurmctldHost=localhost({ctld_addr})
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser={self.user}
AuthType=auth/munge
AuthInfo=socket={r}/munge/munge.socket.2
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin={"task/cgroup" if self.memory_limits else "task/none"}
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters={"CR_CPU_Memory" if self.memory_limits else "CR_CPU"}
DefMemPerCPU={_memory_mb() // cpus}
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=3600
KillWait=5
OverTimeLimit=0
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
{nodes}
PartitionName=debug Nodes={",".join(self.names)} Default=YES MaxTime=INFINITE State=UP
""")

    def _run(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env})

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        m = self.root / "munge"
        cmd = [str(which("munged")), "--key-file", str(key), "--socket", str(m / "munge.socket.2"),
               "--pid-file", str(m / "munged.pid"), "--log-file", str(m / "munged.log"),
               "--seed-file", str(m / "munged.seed")]
        if os.getuid() == 0:
            cmd.append("--force")  # munged will not run as root unless told to
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"munged did not start: {proc.stderr.strip() or proc.stdout.strip()}")

    def _network(self) -> tuple[str, list[str]]:
        """A bridge with slurmctld's address and one network namespace per node, joined to it by
        a veth pair: (slurmctld's address, the nodes' addresses)."""
        tag = f"gb{os.getpid() % 100000}{secrets.token_hex(1)}"  # interface names: at most 15 characters
        routes = _ip("-4", "route", check=False).stdout
        subnet = next(net for net in (f"10.{random.randint(100, 250)}.{random.randint(0, 250)}" for _ in range(100))
                      if f"{net}." not in routes)  # not a network this host already reaches
        names = {"bridge": f"{tag}b", "namespaces": [f"{tag}n{k}" for k in range(1, self.nodes + 1)],
                 "host_ends": [f"{tag}h{k}" for k in range(1, self.nodes + 1)]}
        self.net.write_text(json.dumps(names))
        addrs = [f"{subnet}.{10 + k}" for k in range(1, self.nodes + 1)]
        _ip("link", "add", names["bridge"], "type", "bridge")
        _ip("addr", "add", f"{subnet}.1/24", "dev", names["bridge"])
        _ip("link", "set", names["bridge"], "up")
        # where Docker's br_netfilter sends bridged traffic through a FORWARD chain that drops it
        _ip("link", "set", names["bridge"], "type", "bridge", "nf_call_iptables", "0", check=False)
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in zip(self.names, addrs))
        for ns, host_end, addr in zip(names["namespaces"], names["host_ends"], addrs):
            etc = Path("/etc/netns") / ns  # the node's /etc/hosts
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts)
            _ip("netns", "add", ns)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", host_end, "master", names["bridge"])
            _ip("link", "set", host_end, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        return f"{subnet}.1", addrs

    @staticmethod
    def existing(root: Path) -> SlurmCluster:
        """The cluster configured in ``root`` (its nodes read from slurm.conf)."""
        conf = Path(root) / "slurm.conf"
        text = conf.read_text() if conf.exists() else ""
        return SlurmCluster(root, max(1, sum(line.startswith("NodeName=") for line in text.splitlines())))

    def _net_names(self) -> dict:
        try:
            return json.loads(self.net.read_text())
        except (OSError, ValueError):
            return {}

    def start(self, timeout: float = 60) -> SlurmCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        if any(p for p in self.root.iterdir()):
            raise RuntimeError(f"{self.root}: not empty; a throw-away cluster starts in a new directory")
        self.root.chmod(0o755)  # slurmd runs each job as its user; the spool must be reachable
        if self.nodes > 1 and os.geteuid() != 0:
            raise RuntimeError(f"a {self.nodes}-node cluster needs root (network namespaces)")
        try:
            ctld_addr, addrs = self._network() if self.nodes > 1 else ("127.0.0.1", ["127.0.0.1"])
            self._write_conf(ctld_addr, addrs)
            self._start_munge()
            self._daemon("slurmctld", [str(which("slurmctld")), "-f", str(self.conf), "-c"])
            for k, name in enumerate(self.names):
                (self.root / "spool" / name).mkdir(mode=0o755)
                slurmd = [str(which("slurmd")), "-f", str(self.conf), "-N", name]
                if self.nodes > 1:  # in the node's network namespace, under its own host name, with its
                    # hosts file (not by ip netns exec: it remounts /sys, and slurmd needs /sys/fs/cgroup)
                    ns = self._net_names()["namespaces"][k]
                    slurmd = [str(which("nsenter") or "nsenter"), f"--net=/run/netns/{ns}",
                              str(which("unshare") or "unshare"), "--uts", "--mount", "sh", "-c",
                              f'mount --bind /etc/netns/{ns}/hosts /etc/hosts && hostname {name} && exec "$@"',
                              "sh", *slurmd]
                self._daemon(f"slurmd-{name}", slurmd)
            self._wait_up(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _daemon(self, what: str, cmd: list[str]) -> None:
        proc = self._run(*cmd)
        if proc.returncode != 0:
            raise RuntimeError(f"{what} did not start ({proc.returncode}): {proc.stderr.strip()}\n{self.log(what)}")

    def _wait_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states: list[str] = []
        while time.monotonic() < deadline:
            found = self._run("sinfo", "-h", "-N", "-o", "%T")
            states = found.stdout.split()
            if found.returncode == 0 and len(states) == self.nodes and all(
                    s in ("idle", "mixed", "allocated") for s in states):
                return
            time.sleep(0.5)
        logs = "\n".join(self.log(d) for d in ("slurmctld", *(f"slurmd-{n}" for n in self.names)))
        raise RuntimeError(f"the nodes did not come up within {timeout:g} s (states: {states or 'none'})\n{logs}")

    def log(self, daemon: str, lines: int = 30) -> str:
        """The last lines of a daemon's log: slurmctld, slurmd-node1, ..."""
        path = self.root / f"{daemon}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def cancel_all(self, wait_s: float = 20) -> None:
        """scancel every job, and wait until none is left running (proctrack/linuxproc would
        leave a job's processes behind its stopped slurmd)."""
        if not self.conf.exists() or not (self.root / "slurmctld.pid").exists():
            return
        self._run("scancel", "--user", self.user, timeout=30)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            left = self._run("squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING,CONFIGURING", "-o", "%i", timeout=30)
            if left.returncode != 0 or not left.stdout.strip():
                return
            time.sleep(0.3)

    def stop(self) -> None:
        """Cancel the jobs, stop the daemons and remove the network namespaces; the directory
        stays for the logs."""
        try:
            self.cancel_all()
        except (OSError, subprocess.SubprocessError):
            pass
        _terminate([self.root / f for f in (*(f"slurmd-{n}.pid" for n in self.names), "slurmctld.pid",
                                            "munge/munged.pid")])
        for name in self.names:  # the cgroups slurmd made (slurm_<node>), bottom-up, where empty
            for top in CGROUP_V1.glob(f"*/slurm_{name}"):
                for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
                    try:
                        d.rmdir()
                    except OSError:
                        pass
        names = self._net_names()
        for ns in names.get("namespaces", []):
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        for link in (*names.get("host_ends", []), *([names["bridge"]] if "bridge" in names else [])):
            _ip("link", "del", link, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _terminate(pidfiles: list[Path], grace_s: float = 10) -> None:
    """SIGTERM the daemons all at once (each takes a second or two to exit), then SIGKILL what
    is left after the grace period."""
    pids = []
    for pidfile in pidfiles:
        try:
            pid = int(pidfile.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
        except (OSError, ValueError):
            continue
    deadline = time.monotonic() + grace_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in filter(_alive, pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python scripts/slurm_cluster.py",
                                     description="a throw-away Slurm cluster on this host, for tests")
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("dir", type=Path, help="a new (or empty) directory for its configuration, state and logs")
    parser.add_argument("--nodes", type=int, default=1, help="slurmd nodes (2 or more: network namespaces)")
    args = parser.parse_args(argv)
    if args.action == "start":
        gone = missing()
        if gone:
            print(f"missing: {', '.join(gone)} (apt-get install slurm-wlm munge)", file=sys.stderr)
            return 1
        cluster = SlurmCluster(args.dir, args.nodes).start()
        print(f"export SLURM_CONF={cluster.conf}")
    else:
        SlurmCluster.existing(args.dir).stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
