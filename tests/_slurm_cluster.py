"""A two-node Slurm cluster on this machine, for the tests marked `slurm`.

One `slurmctld` and two `slurmd -N n1|n2` (Debian's `slurm-wlm` is built with several slurmd
per host), all on 127.0.0.1 with their own ports, spool folders, pid and log files, and a
`munged` of their own (its key owned by the `munge` user, as munged requires). Slurm's clients
find the cluster through `SLURM_CONF`, which the `slurm_cluster` fixture sets for the session.
The test cluster is tuned to requeue at once: a requeued job waits for the credential's expiry
(`AuthInfo=cred_expire`, 120 s by default) and the scheduler's interval, both shortened here.
There is no accounting (`sacct`): job states come from `squeue` / `scontrol`.

`slurm_cluster` (session-scoped; a test module imports `slurm_cluster_fixture`) installs
`slurm-wlm` and `munge` with apt-get when they are missing and the tests run as root, and
skips with the reason when the cluster cannot start.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

NODES = ("n1", "n2")
CPUS_PER_NODE = 2
PARTITIONS = ("debug", "second")  # debug: both nodes (the default); second: n2 only
_DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "srun")


class ClusterUnavailable(Exception):
    """Slurm cannot start here; the message says why."""


@dataclasses.dataclass
class SlurmCluster:
    """A running test cluster: its folder, its config, the environment its clients need."""

    root: pathlib.Path
    conf: pathlib.Path
    processes: list[subprocess.Popen[bytes]]

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        env = {**os.environ, **self.env}
        return subprocess.run(command, capture_output=True, text=True, env=env, check=check)

    def jobs(self) -> list[str]:
        """Ids of the jobs squeue lists (pending, running, completing)."""
        out = self.run("squeue", "--noheader", "--format=%i", check=False).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def cancel_all(self) -> None:
        """Cancel every job and wait until none is listed (a test's leftovers)."""
        for job in self.jobs():
            self.run("scancel", job, check=False)
        deadline = time.monotonic() + 30
        while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.5)

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        pid_file = self.root / "munge" / "munged.pid"
        if pid_file.is_file():
            try:
                os.kill(int(pid_file.read_text().strip()), 15)
            except (OSError, ValueError):
                pass


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _install() -> None:
    """apt-get the packages when a daemon is missing and this runs as root."""
    if all(shutil.which(name) or pathlib.Path("/usr/sbin", name).exists() for name in _DAEMONS):
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable("slurm-wlm / munge are not installed and this is not root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"],
    ):
        done = subprocess.run(step, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise ClusterUnavailable(f"{' '.join(step)} failed: {done.stderr.strip()[-500:]}")


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if found is None:
        raise ClusterUnavailable(f"{name} not found after installing slurm-wlm and munge")
    return found


def _config(root: pathlib.Path, ctld_port: int, node_ports: list[int], sock: pathlib.Path) -> str:
    nodes = "\n".join(
        f"NodeName={name} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 Port={port} "
        f"CPUs={CPUS_PER_NODE} RealMemory=2000 State=UNKNOWN"
        for name, port in zip(NODES, node_ports, strict=True)
    )
    return f"""\
ClusterName=lbtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock},cred_expire=10
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
LaunchParameters=use_interactive_step
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1,batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=600
InactiveLimit=0
MessageTimeout=10
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
PartitionName=second Nodes={NODES[1]} MaxTime=INFINITE State=UP
"""


def _start_munge(root: pathlib.Path) -> pathlib.Path:
    folder = root / "munge"
    folder.mkdir()
    folder.chmod(0o755)  # munged requires its socket folder executable by all
    try:
        munge = pwd.getpwnam("munge")
    except KeyError:
        raise ClusterUnavailable("no `munge` user (install the munge package)") from None
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    for path in (folder, key):
        os.chown(path, munge.pw_uid, munge.pw_gid)
    sock = folder / "munge.sock"
    command = [
        "runuser", "-u", "munge", "--", _binary("munged"), f"--socket={sock}",
        f"--key-file={key}", f"--pid-file={folder / 'munged.pid'}",
        f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'munged.seed'}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterUnavailable(f"munged did not start: {done.stderr.strip()}")
    return sock


def _wait_nodes(cluster: SlurmCluster, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    states = ""
    while time.monotonic() < deadline:
        for process in cluster.processes:
            if process.poll() is not None:
                logs = "".join(p.read_text()[-800:] for p in cluster.root.glob("*.log"))
                raise ClusterUnavailable(f"{process.args[0]} exited: {logs}")
        done = cluster.run("sinfo", "--noheader", "--Node", "--format=%N %t", check=False)
        states = done.stdout.strip()
        idle = [line for line in states.splitlines() if line.split()[-1] in ("idle", "mix")]
        if len({line.split()[0] for line in idle}) == len(NODES):
            return
        time.sleep(0.5)
    raise ClusterUnavailable(f"the nodes did not become idle within {timeout:g} s: {states!r}")


def start_cluster(root: pathlib.Path) -> SlurmCluster:
    """Start munged, slurmctld and the two slurmd in `root` (ClusterUnavailable on failure)."""
    _install()
    for sub in ("state", "spool/n1", "spool/n2"):
        (root / sub).mkdir(parents=True)
    sock = _start_munge(root)
    ctld_port, *node_ports = _free_ports(1 + len(NODES))
    conf = root / "slurm.conf"
    conf.write_text(_config(root, ctld_port, node_ports, sock))
    cluster = SlurmCluster(root, conf, [])
    out = open(root / "daemons.out", "ab")  # noqa: SIM115 - kept open by the daemons
    try:
        ctld = [_binary("slurmctld"), "-D", "-i", "-f", str(conf)]
        cluster.processes.append(subprocess.Popen(ctld, stdout=out, stderr=out))
        for name in NODES:
            slurmd = [_binary("slurmd"), "-D", "-N", name, "-f", str(conf)]
            cluster.processes.append(subprocess.Popen(slurmd, stdout=out, stderr=out))
        _wait_nodes(cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session", name="slurm_cluster")
def slurm_cluster_fixture() -> Iterator[SlurmCluster]:
    """The two-node cluster for the session, its clients' `SLURM_CONF` set (skipped with the
    reason where Slurm cannot start)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="lb-slurm-"))
    root.chmod(0o755)
    try:
        cluster = start_cluster(root)
    except (ClusterUnavailable, OSError) as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"no Slurm test cluster: {exc}")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.cancel_all()
        cluster.stop()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        shutil.rmtree(root, ignore_errors=True)
