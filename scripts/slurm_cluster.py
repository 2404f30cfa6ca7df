"""A throw-away single-host Slurm cluster from the system's packages, for gpubench's tests.

    python scripts/slurm_cluster.py start DIR     # prints: export SLURM_CONF=DIR/slurm.conf
    python scripts/slurm_cluster.py stop DIR

Starts munged (with a fresh key), slurmctld and one slurmd, all configured in DIR (which must
not exist, or be empty) on free local ports, as the user running it (root in CI: slurmd runs
each job as the user who submitted it, and only root can switch users). No cgroups, no
accounting database: jobs are tracked with proctrack/linuxproc, and finished jobs stay known to
``scontrol show job`` for an hour (MinJobAge). ``apt-get install slurm-wlm munge`` provides
the binaries; ``missing()`` says which are not there.
"""

from __future__ import annotations

import os
import pwd
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


class SlurmCluster:
    """One slurmctld and one slurmd (node ``name``) on this host, configured in ``root``."""

    def __init__(self, root: Path, name: str = "node1") -> None:
        self.root = Path(root).resolve()
        self.name = name
        self.conf = self.root / "slurm.conf"
        self.user = pwd.getpwuid(os.getuid()).pw_name

    @property
    def env(self) -> dict[str, str]:
        """The variables that point Slurm's commands at this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def _write_conf(self) -> None:
        ctld, slurmd = _free_ports(2)
        cpus = os.cpu_count() or 1
        for d in ("state", "spool", "munge"):
            (self.root / d).mkdir(mode=0o700, exist_ok=True)
        r = self.root
        self.conf.write_text(f"""\
ClusterName=gpubenchtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser={self.user}
AuthType=auth/munge
AuthInfo=socket={r}/munge/munge.socket.2
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=3600
KillWait=5
OverTimeLimit=0
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName={self.name} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={_memory_mb()} State=UNKNOWN
PartitionName=debug Nodes={self.name} Default=YES MaxTime=INFINITE State=UP
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

    def start(self, timeout: float = 60) -> SlurmCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        if any(p for p in self.root.iterdir()):
            raise RuntimeError(f"{self.root}: not empty; a throw-away cluster starts in a new directory")
        self.root.chmod(0o755)  # slurmd runs each job as its user; the spool must be reachable
        self._write_conf()
        self._start_munge()
        for daemon, args in (("slurmctld", ["-c"]), ("slurmd", ["-N", self.name])):
            proc = self._run(str(which(daemon)), "-f", str(self.conf), *args)
            if proc.returncode != 0:
                raise RuntimeError(f"{daemon} did not start ({proc.returncode}): {proc.stderr.strip()}\n"
                                   f"{self.log(daemon)}")
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            found = self._run("sinfo", "-h", "-N", "-o", "%T")
            state = found.stdout.strip()
            if found.returncode == 0 and state in ("idle", "mixed", "allocated"):
                return self
            time.sleep(0.5)
        raise RuntimeError(f"the node did not come up within {timeout:g} s (state: {state or 'none'})\n"
                           f"{self.log('slurmctld')}\n{self.log('slurmd')}")

    def log(self, daemon: str, lines: int = 30) -> str:
        path = self.root / f"{daemon}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the daemons (their jobs with them); the directory stays for their logs."""
        for pidfile in ("slurmd.pid", "slurmctld.pid", "munge/munged.pid"):
            path = self.root / pidfile
            try:
                pid = int(path.read_text().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print(__doc__.strip().splitlines()[2:4] and "usage: slurm_cluster.py start|stop DIR", file=sys.stderr)
        return 2
    cluster = SlurmCluster(Path(argv[1]))
    if argv[0] == "start":
        gone = missing()
        if gone:
            print(f"missing: {', '.join(gone)} (apt-get install slurm-wlm munge)", file=sys.stderr)
            return 1
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}")
    else:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
