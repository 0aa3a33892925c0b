"""A two-node Slurm cluster on this machine (and a spare node), for the tests marked `slurm`.

One `slurmctld` and three `slurmd -N n1|n2|n3` (Debian's `slurm-wlm` is built with several
slurmd per host), all on 127.0.0.1 with their own ports, spool folders, pid and log files, and
a `munged` of their own (its key owned by the `munge` user, as munged requires). `n1` and `n2`
are the cluster the trials run on (partition `debug`, the default; `second` is `n2` alone);
`n3` is alone in partition `spare`, for a test that takes its node down without touching the
jobs of the others. Slurm's clients find the cluster through `SLURM_CONF`, which the
`slurm_cluster` fixture sets for the session. The test cluster is tuned to requeue at once: a
requeued job waits for the credential's expiry (`AuthInfo=cred_expire`, 120 s by default) and
the scheduler's interval, both shortened here. There is no accounting (`sacct`): job states
come from `squeue` / `scontrol`.

`slurm_cluster` (session-scoped; a test module imports `slurm_cluster_fixture`) installs
`slurm-wlm` and `munge` with apt-get when they are missing and the tests run as root, and
skips with the reason when the cluster cannot start. Under pytest-xdist the workers share one
cluster: the first to need it starts it, under a file lock, and the last one done stops it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import pathlib
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests._servers import apt_install, free_ports, is_running, signal_quietly

NODES = ("n1", "n2", "n3")
CPUS_PER_NODE = 2
# debug: n1 and n2 (the default); second: n2 only; spare: n3 only (a node a test may lose)
PARTITIONS = {"debug": ("n1", "n2"), "second": ("n2",), "spare": ("n3",)}
_DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "srun")


class ClusterUnavailable(Exception):
    """Slurm cannot start here; the message says why."""


@dataclasses.dataclass
class SlurmCluster:
    """A running test cluster: its folder, its config, the environment its clients need."""

    root: pathlib.Path
    conf: pathlib.Path
    processes: list[subprocess.Popen[bytes]]  # the daemons this process started

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        env = {**os.environ, **self.env}
        return subprocess.run(command, capture_output=True, text=True, env=env, check=check)

    def jobs(self, under: pathlib.Path | None = None) -> list[str]:
        """Ids of the jobs squeue lists (pending, running, completing); `under`: only those
        whose working folder is in it (a test's own, on a cluster other tests share)."""
        out = self.run("squeue", "--noheader", "--format=%i %Z", check=False).stdout
        rows = [line.split(maxsplit=1) for line in out.splitlines() if line.strip()]
        return [
            row[0]
            for row in rows
            if under is None or (len(row) > 1 and pathlib.Path(row[1]).is_relative_to(under))
        ]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job`'s fields of the job (empty when Slurm does not know it)."""
        out = self.run("scontrol", "show", "job", "--oneliner", job_id, check=False).stdout
        fields: dict[str, str] = {}
        for word in out.split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
        return fields

    def cancel_all(self) -> None:
        """Cancel every job and wait until none is listed (a test's leftovers)."""
        for job in self.jobs():
            self.run("scancel", job, check=False)
        deadline = time.monotonic() + 30
        while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.5)

    def _pid(self, daemon: str) -> int | None:
        """The pid a daemon wrote to its pid file (None when it has none)."""
        path = self.root / f"{daemon}.pid"
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    def kill_node(self, name: str) -> None:
        """SIGKILL the node's slurmd (the node is lost; its jobs' processes are the caller's
        to end, as a machine going down ends them)."""
        pid = self._pid(f"slurmd.{name}")
        if pid is not None:
            signal_quietly(pid, 9)

    def start_node(self, name: str) -> None:
        """Start the node's slurmd again (it registers with slurmctld by itself)."""
        command = [_binary("slurmd"), "-D", "-N", name, "-f", str(self.conf)]
        with open(self.root / "daemons.out", "ab") as out:
            self.processes.append(subprocess.Popen(command, stdout=out, stderr=out))

    def stop(self) -> None:
        """End every daemon of the cluster, wherever it was started (by its pid file)."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        pids = [self._pid(f"slurmd.{name}") for name in NODES]
        pids += [self._pid("slurmctld"), self._pid("munge/munged")]
        for pid in pids:
            if pid is not None:
                signal_quietly(pid, 15)
        deadline = time.monotonic() + 15
        while any(is_running(p) for p in pids if p is not None) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in pids:
            if pid is not None and is_running(pid):
                signal_quietly(pid, 9)
        for process in self.processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _install() -> None:
    """apt-get the packages when a daemon is missing and this runs as root."""

    def installed() -> bool:
        return all(shutil.which(n) or pathlib.Path("/usr/sbin", n).exists() for n in _DAEMONS)

    if installed():
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable("slurm-wlm / munge are not installed and this is not root")
    failed = apt_install(["slurm-wlm", "munge"], installed)
    if failed is not None:
        raise ClusterUnavailable(failed)


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
    partitions = "\n".join(
        f"PartitionName={name} Nodes={','.join(nodes)} MaxTime=INFINITE State=UP"
        + (" Default=YES" if name == "debug" else "")
        for name, nodes in PARTITIONS.items()
    )
    return f"""\
ClusterName=lbtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock},cred_expire=5
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
{partitions}
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
    for sub in ("state", *(f"spool/{name}" for name in NODES)):
        (root / sub).mkdir(parents=True)
    sock = _start_munge(root)
    ctld_port, *node_ports = free_ports(1 + len(NODES))
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


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The folder every xdist worker of this session sees (the session's own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def exclusive(path: pathlib.Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) across the session's workers."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[dict[str, Any]]:
    """The shared cluster's state file, read and written under an exclusive lock."""
    with exclusive(path.with_suffix(".lock")):
        state = json.loads(path.read_text()) if path.is_file() else {}
        yield state
        path.write_text(json.dumps(state))


def _shared(root: pathlib.Path) -> SlurmCluster:
    return SlurmCluster(root, root / "slurm.conf", [])


@pytest.fixture(scope="session", name="slurm_cluster")
def slurm_cluster_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The cluster for the session, its clients' `SLURM_CONF` set (skipped with the reason
    where Slurm cannot start). xdist's workers share one: the first starts it, the last
    stops it (a count of users in a state file, under a lock, beside the workers' folders)."""
    state_file = shared_folder(tmp_path_factory) / "slurm-cluster.json"
    with _locked(state_file) as state:
        if "error" in state:
            pytest.skip(f"no Slurm test cluster: {state['error']}")
        if "root" in state:
            cluster = _shared(pathlib.Path(state["root"]))
        else:
            root = pathlib.Path(tempfile.mkdtemp(prefix="lb-slurm-"))
            root.chmod(0o755)
            try:
                cluster = start_cluster(root)
            except (ClusterUnavailable, OSError) as exc:
                shutil.rmtree(root, ignore_errors=True)
                state["error"] = str(exc)
                state_file.write_text(json.dumps(state))
                pytest.skip(f"no Slurm test cluster: {exc}")
            state.update(root=str(root), users=0)
        state["users"] += 1
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        with _locked(state_file) as state:
            state["users"] -= 1
            if state["users"] == 0:
                cluster.cancel_all()
                cluster.stop()
                shutil.rmtree(cluster.root, ignore_errors=True)
                state.clear()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
