"""A two-node Ray cluster on this machine, for the tests marked `ray`.

`ray start --head --block` and a second `ray start --address --block` (the `ray` beside this
Python), both with `--node-ip-address=127.0.0.1` (Ray registers them under the machine's
address; the cluster answers on 127.0.0.1) and ports of their own (none of Ray's defaults, so
the cluster sits beside any other on the machine), each node with its own temporary folder
(Ray 2.60 takes a worker node's `--temp-dir`) and log file, in a process session of its own.
Each node has 2 CPUs and a custom resource naming it, `node-a` (the head) or `node-b` (the
worker), so that a test places work on a chosen node with `resources={"node-b": 1}`. The
nodes' Python path has this checkout's root, so their workers import `tests.*` as the test
process does. A driver on this machine attaches to the head node (Ray prefers the head when
several nodes share a machine), so losing the worker does not take the driver with it.

The head's GCS is tuned to notice a lost node in about 3 s, much sooner than with Ray's
defaults: `kill_worker` loses the worker node as a machine going down would, and
`start_worker` adds a new one. A `--block` node ends its Ray processes when its `ray start`
is terminated; `stop_head` does that for both nodes and then kills, by pid, any process of
this cluster left (found by its process session and by a mark in its environment), never
with `ray stop`, which would end every Ray cluster on the machine. A node that misses Ray's
fixed 30 s to register (a loaded machine) is cleaned up and started again (START_TRIES).

The cluster runs with Ray's token authentication (`RAY_AUTH_MODE=token`): one token for the
test session (`auth_token`), in a file of the user's only (`RAY_AUTH_TOKEN_PATH`). The nodes
read it from there, and while a cluster runs this process's environment names it too
(`AUTH_ENV`), so that what a test starts (the bridge's commands, `ray list`, `ray.init` here)
reaches the cluster as a user's shell with the token would.

The fixtures are registered once, by tests/conftest.py (imported into each test module, a
session-scoped fixture would be each module's own, one cluster per module). `ray_cluster`
(session-scoped) is shared by the session's tests; `spare_ray_cluster` is a second cluster
that the tests losing a worker node share in turn, its worker replaced between them;
`fresh_ray_cluster` (function-scoped) is a test's own, for a test that takes the whole
cluster down.
They skip with the reason when Ray is missing or the cluster cannot start. The ray session
runs with `-n 0`.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

from tests._servers import free_ports, is_running, signal_quietly

CPUS_PER_NODE = 2
RESOURCES = {"head": "node-a", "worker": "node-b"}  # the custom resource naming each node
OBJECT_STORE_BYTES = 256 * 1024**2  # per node (Ray's default is 30% of the machine's memory)
# A bound on waiting for the nodes to be alive, met in seconds on a quiet machine: a loaded one
# (the other lane, another cluster) takes minutes, which is no failure of what is tested.
START_TIMEOUT = 300.0
# `ray start` gives its node a fixed 30 s to register with the GCS; on a loaded machine (CI's
# other lane beside two clusters) a node sometimes misses it ("The current node timed out
# during startup") and its `ray start` exits. Such a node is cleaned up and started again.
START_TRIES = 3
# The head's GCS checks each raylet every second and gives up on it after 3 failed checks.
HEALTH_CHECK = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "3",
}
# The head's Ray Client server forks a server per client while its gRPC threads run; gRPC's
# fork handlers then sometimes crash the child ("Check failed: next_worker->state == KICKED",
# ray-project/ray#63202). The child execs at once: it needs no fork handlers.
HEAD_ENV = {**HEALTH_CHECK, "GRPC_ENABLE_FORK_SUPPORT": "false"}
# Set by the `ray` nox session: there, a cluster that cannot start fails the tests (elsewhere
# they are skipped with the reason).
REQUIRED_ENV = "LIGHTNING_BRIDGE_RAY_REQUIRED"
MARK = "LIGHTNING_BRIDGE_TEST_RAY_CLUSTER"  # in each node's environment: the cluster's folder
REPOSITORY = pathlib.Path(__file__).resolve().parent.parent


_TOKEN: list[pathlib.Path] = []  # the session's token file, once written


def token_path() -> pathlib.Path:
    """The file of the session's Ray token: written on first use, in a folder of its own
    (mode 0700, the file 0600), removed when the test process ends."""
    if not _TOKEN:
        folder = tempfile.mkdtemp(prefix="lb-ray-token-", dir=_temp_root())
        atexit.register(shutil.rmtree, folder, True)
        path = pathlib.Path(folder) / "auth_token"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
        _TOKEN.append(path)
    return _TOKEN[0]


def auth_token() -> str:
    """The session's Ray token."""
    return token_path().read_text().strip()


def auth_env() -> dict[str, str]:
    """What reaches a cluster with token authentication: the mode and the token's file."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path())}


class ClusterUnavailable(Exception):
    """The Ray cluster cannot start here; the message says why."""


@dataclasses.dataclass
class RayNode:
    """One `ray start --block` process: the node's name, its folder, its output."""

    name: str  # "head", "worker", then "worker-2", ... for the workers started after a loss
    temp_dir: pathlib.Path
    log: pathlib.Path
    process: subprocess.Popen[bytes]

    @property
    def session(self) -> int:
        """The process session of the node's processes (`ray start` leads it)."""
        return self.process.pid

    def processes(self) -> list[int]:
        """The node's live processes (those of its session)."""
        return [pid for pid in _session_pids(self.session) if is_running(pid)]


@dataclasses.dataclass
class RayCluster:
    """A running test cluster: its addresses, its nodes, the environment its clients need."""

    root: pathlib.Path
    port: int  # the GCS
    client_port: int  # Ray Client's server
    dashboard_port: int
    head: RayNode
    worker: RayNode | None
    past_nodes: list[RayNode] = dataclasses.field(default_factory=list)  # workers lost

    @property
    def address(self) -> str:
        """The GCS address, for `ray.init(address=...)` and `RAY_ADDRESS`."""
        return f"127.0.0.1:{self.port}"

    @property
    def client_address(self) -> str:
        return f"ray://127.0.0.1:{self.client_port}"

    @property
    def dashboard_url(self) -> str:
        """The dashboard (and the job submission and state APIs behind it)."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def env(self) -> dict[str, str]:
        """What a subprocess needs to find the cluster."""
        return {"RAY_ADDRESS": self.address}

    @property
    def head_log(self) -> pathlib.Path:
        return self.head.log

    @property
    def worker_log(self) -> pathlib.Path | None:
        """The current worker node's `ray start` output (None while there is none)."""
        return None if self.worker is None else self.worker.log

    def ray_logs(self, name: str = "head") -> pathlib.Path:
        """The folder of Ray's own logs of the node (raylet.out, gcs_server.out, ...)."""
        node = self.head if name == "head" else self.worker
        if node is None:
            raise ValueError("the cluster has no worker node")
        return node.temp_dir / "session_latest" / "logs"

    def node_ids(self) -> dict[str, str]:
        """The alive nodes' ids by name ("head", "worker"), from the GCS through the dashboard."""
        from ray.util.state import list_nodes

        # Filtered here: with a state filter, the API fails once a node is dead ("missing
        # output", counting the dead ones).
        ids: dict[str, str] = {}
        for node in list_nodes(address=self.dashboard_url, detail=True):
            if node.state != "ALIVE":
                continue
            for name, resource in RESOURCES.items():
                if resource in (node.resources_total or {}):
                    ids[name] = node.node_id
        return ids

    def wait_nodes(self, names: set[str], timeout: float = START_TIMEOUT) -> dict[str, str]:
        """Wait until exactly the nodes `names` are alive; their ids (ClusterUnavailable with
        the logs' tail when they are not within `timeout`)."""
        deadline = time.monotonic() + timeout
        seen: object = None
        while time.monotonic() < deadline:
            for role, node in (("head", self.head), ("worker", self.worker)):
                if node is not None and role in names and node.process.poll() is not None:
                    raise ClusterUnavailable(
                        f"`ray start` of the {role} exited ({node.process.returncode}):"
                        f"\n{self.logs_tail()}"
                    )
            try:
                ids = self.node_ids()
            except Exception as exc:  # the dashboard is not up yet
                seen = exc
            else:
                if set(ids) == names:
                    return ids
                seen = ids
            time.sleep(0.5)
        raise ClusterUnavailable(
            f"the nodes {sorted(names)} were not the alive ones within {timeout:g} s (last seen:"
            f" {seen!r}):\n{self.logs_tail()}"
        )

    def logs_tail(self, chars: int = 2000) -> str:
        """The end of each node's `ray start` output and of its raylet's log (for failure
        messages)."""
        parts = []
        for node in self._nodes():
            parts.append(f"--- {node.log}:\n{_tail(node.log, chars)}")
            raylet = node.temp_dir / "session_latest" / "logs" / "raylet.out"
            if raylet.exists():
                parts.append(f"--- {raylet}:\n{_tail(raylet, chars // 2)}")
        return "\n".join(parts)

    def kill_worker(self) -> None:
        """Lose the worker node as a machine going down does: SIGKILL its raylet, then every
        process of the node; return when the GCS counts it dead (the head alone alive)."""
        node = self.worker
        if node is None:
            raise ValueError("the cluster has no worker node")
        for pid in node.processes():
            if _command(pid)[:1] and _command(pid)[0].endswith("/raylet"):
                signal_quietly(pid, signal.SIGKILL)
        _kill_session(node)
        deadline = time.monotonic() + 10
        while node.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.worker = None
        self.past_nodes.append(node)
        self.wait_nodes({"head"})

    def start_worker(self) -> None:
        """Start a (new) worker node and wait until both nodes are alive."""
        if self.worker is not None and self.worker.process.poll() is None:
            raise ValueError("the worker node is running")
        self._join_worker(f"worker-{len(self.past_nodes) + 1}" if self.past_nodes else "worker")

    def _join_worker(self, name: str) -> None:
        """Start the worker node `name` and wait until both nodes are alive; a start that
        fails (see START_TRIES) is lost as `kill_worker` loses a node, then tried again."""
        for attempt in range(1, START_TRIES + 1):
            folder = name if attempt == 1 else f"{name}-try{attempt}"
            self.worker = _start_node(self.root, folder, _worker_command(self, self.root / folder))
            try:
                self.wait_nodes({"head", "worker"})
                return
            except ClusterUnavailable as exc:
                if attempt == START_TRIES:
                    raise
                print(
                    f"the Ray test cluster's worker node did not start (try {attempt} of "
                    f"{START_TRIES}); starting it again: {str(exc).splitlines()[0]}",
                    file=sys.stderr,
                )
                self.kill_worker()

    def stop_head(self) -> None:
        """End the whole cluster: terminate the worker's and the head's `ray start` (each ends
        its node's processes), then kill whatever of this cluster is left, by pid."""
        nodes = list(reversed(self._nodes()))  # the worker first
        for node in nodes:
            if node.process.poll() is None:
                node.process.terminate()
            try:
                node.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        while self.leftovers() and time.monotonic() < deadline:
            time.sleep(0.2)
        for node in (self.head, self.worker):
            if node is not None:
                _kill_session(node)
        for pid in self.leftovers():
            signal_quietly(pid, signal.SIGKILL)

    def crash(self) -> None:
        """The whole cluster dies at once (its head's machine lost): SIGKILL every process of
        both nodes' sessions. What the cluster's workers started in sessions of their own
        (a trial's processes) is left to end by itself, as it would on real nodes."""
        for node in (self.worker, self.head):
            if node is not None:
                _kill_session(node)

    def leftovers(self) -> list[int]:
        """Live processes of this cluster: in the session of its head or worker node, or
        marked with its folder in their environment (Ray renames some processes, e.g.
        `ray::DashboardAgent`, over their environment). A lost worker's session is not
        counted: it was empty when `kill_worker` returned, and its number may be reused."""
        sessions = {node.session for node in (self.head, self.worker) if node is not None}
        mark = f"{MARK}={self.root}".encode()
        pids = []
        for pid in _pids():
            if pid == os.getpid() or not is_running(pid):
                continue
            try:
                in_session = os.getsid(pid) in sessions
                environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if in_session or mark in environ:
                pids.append(pid)
        return pids

    def _nodes(self) -> list[RayNode]:
        return [self.head, *self.past_nodes, *([self.worker] if self.worker else [])]


def _tail(path: pathlib.Path, chars: int) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as exc:
        return f"({exc})"


def _pids() -> list[int]:
    return [int(p.name) for p in pathlib.Path("/proc").iterdir() if p.name.isdigit()]


def _session_pids(session: int) -> list[int]:
    pids = []
    for pid in _pids():
        try:
            if os.getsid(pid) == session:
                pids.append(pid)
        except OSError:
            pass
    return pids


def _command(pid: int) -> list[str]:
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _kill_session(node: RayNode) -> None:
    """SIGKILL the node's process group, then every other process of its session (Ray's
    workers lead groups of their own), and reap its `ray start`."""
    try:
        os.killpg(node.process.pid, signal.SIGKILL)
    except OSError:
        pass
    for pid in _session_pids(node.session):
        signal_quietly(pid, signal.SIGKILL)
    try:
        node.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _temp_root() -> str | None:
    """/tmp where it exists (else the platform's temporary folder)."""
    return "/tmp" if os.path.isdir("/tmp") else None


def _ray() -> str:
    """The `ray` command of this Python's environment."""
    ray = pathlib.Path(sys.executable).parent / "ray"
    if not ray.is_file():
        raise ClusterUnavailable(f"Ray is not installed beside {sys.executable} (no {ray})")
    return str(ray)


def _node_options(name: str, temp_dir: pathlib.Path) -> list[str]:
    """What both kinds of node take: the address, CPUs, the resource naming it, its folder
    and its own ports (Ray's defaults would clash with another node on the machine)."""
    manager, objects, metrics, agent, agent_grpc, runtime_env = free_ports(6)
    resource = RESOURCES["head" if name == "head" else "worker"]
    return [
        "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={CPUS_PER_NODE}",
        f"--resources={json.dumps({resource: 100})}", f"--temp-dir={temp_dir}",
        f"--object-store-memory={OBJECT_STORE_BYTES}", f"--node-manager-port={manager}",
        f"--object-manager-port={objects}", f"--metrics-export-port={metrics}",
        f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--runtime-env-agent-port={runtime_env}", "--disable-usage-stats",
    ]  # fmt: skip


def _worker_command(cluster: RayCluster, temp_dir: pathlib.Path) -> list[str]:
    return [_ray(), "start", f"--address={cluster.address}", *_node_options("worker", temp_dir)]


def _start_node(
    root: pathlib.Path, name: str, command: list[str], extra_env: dict[str, str] | None = None
) -> RayNode:
    """Run `command` (a `ray start --block`) in a session of its own, its output to a log,
    with `extra_env` in its environment."""
    temp_dir = root / name
    temp_dir.mkdir()
    log = root / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(auth_env())
    python_path = [p for p in (env.get("PYTHONPATH"), str(REPOSITORY)) if p]
    env.update(extra_env or {}, PYTHONPATH=os.pathsep.join(python_path), **{MARK: str(root)})
    with open(log, "ab") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    return RayNode(name, temp_dir, log, process)


def start_cluster(root: pathlib.Path) -> RayCluster:
    """Start the head and a worker node in `root` and wait until both are alive
    (ClusterUnavailable on failure, after stopping what started)."""
    ray = _ray()
    port, client_port, dashboard_port = free_ports(3)
    head_command = [
        ray, "start", "--head", f"--port={port}", f"--ray-client-server-port={client_port}",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}", *_node_options("head", root / "head"),
    ]  # fmt: skip
    head = _start_node(root, "head", head_command, HEAD_ENV)
    cluster = RayCluster(root, port, client_port, dashboard_port, head, None)
    try:
        cluster.wait_nodes({"head"})
        cluster._join_worker("worker")
    except BaseException:
        cluster.stop_head()
        raise
    return cluster


@pytest.fixture(scope="session", name="ray_cluster")
def ray_cluster_fixture() -> Iterator[RayCluster]:
    """The session's cluster, shared by its tests (skipped with the reason where it cannot
    start); stopped at the session's end."""
    yield from _cluster()


@pytest.fixture(name="fresh_ray_cluster")
def fresh_ray_cluster_fixture() -> Iterator[RayCluster]:
    """A cluster of the test's own (for a test that takes the whole cluster down), stopped
    at its end."""
    yield from _cluster()


_SPARE: list[RayCluster] = []  # the session's spare cluster, while one runs


@pytest.fixture(scope="session", name="spare_ray_clusters")
def spare_ray_clusters_fixture() -> Iterator[list[RayCluster]]:
    """Where `spare_ray_cluster` keeps its cluster; the one left is stopped at the
    session's end."""
    yield _SPARE
    while _SPARE:
        _stop(_SPARE.pop())


@pytest.fixture(name="spare_ray_cluster")
def spare_ray_cluster_fixture(
    request: pytest.FixtureRequest, spare_ray_clusters: list[RayCluster]
) -> Iterator[RayCluster]:
    """A second cluster, apart from the session's, for tests that lose its worker node
    (killed or drained): they share it in turn, each getting both nodes alive. A worker
    node a test lost is replaced before the next test (`start_worker`: seconds, where a
    whole cluster takes half a minute); a test that fails takes the cluster down with it,
    and the next test starts a new one. After the last test using it, it is stopped (its
    idle nodes would take CPU from the session's other tests)."""
    with _auth_environment():
        cluster = _repaired_spare(spare_ray_clusters)
        failed = request.session.testsfailed
        yield cluster
        if request.session.testsfailed > failed or not _used_later(request):
            spare_ray_clusters.remove(cluster)
            _stop(cluster)


def _used_later(request: pytest.FixtureRequest) -> bool:
    """Whether a test after this one in the session uses the spare cluster."""
    items = request.session.items
    later = items[items.index(request.node) + 1 :] if request.node in items else items
    return any("spare_ray_cluster" in getattr(item, "fixturenames", ()) for item in later)


def _repaired_spare(spares: list[RayCluster]) -> RayCluster:
    """The spare cluster with both nodes alive: its worker started again where a test lost
    it; a new cluster where there is none or its head is gone."""
    if spares:
        cluster = spares[0]
        try:
            if cluster.head.process.poll() is not None or "head" not in cluster.node_ids():
                raise ClusterUnavailable("the spare cluster's head is gone")
            worker = cluster.worker
            if worker is not None and (
                worker.process.poll() is not None or "worker" not in cluster.node_ids()
            ):
                cluster.kill_worker()  # its leftovers, until the GCS counts it dead
            if cluster.worker is None:
                cluster.start_worker()
            return cluster
        except (ClusterUnavailable, OSError) as exc:
            print(f"the spare Ray test cluster is started again: {exc}", file=sys.stderr)
            spares.remove(cluster)
            _stop(cluster)
    spares.append(_started())
    return spares[0]


def _cluster() -> Iterator[RayCluster]:
    with _auth_environment():
        cluster = _started()
        try:
            yield cluster
        finally:
            _stop(cluster)


@contextlib.contextmanager
def _auth_environment() -> Iterator[None]:
    """This process's environment naming the session's token while a cluster is in use."""
    saved = {name: os.environ.get(name) for name in (*auth_env(), "RAY_AUTH_TOKEN")}
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.update(auth_env())
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _started() -> RayCluster:
    """A new cluster; where it cannot start, the test fails (the ray session) or is skipped."""
    try:
        return _start_in_temp()
    except (ClusterUnavailable, OSError) as exc:
        if os.environ.get(REQUIRED_ENV) == "1":  # the ray session: no cluster is a failure
            pytest.fail(f"the Ray test cluster did not start: {exc}")
        pytest.skip(f"no Ray test cluster: {exc}")


def _stop(cluster: RayCluster) -> None:
    """Stop the cluster and remove its folder; a process of it left is a failure."""
    cluster.stop_head()
    left = cluster.leftovers()
    shutil.rmtree(cluster.root, ignore_errors=True)
    if left:
        raise AssertionError(f"processes of the Ray test cluster outlived it: {left}")


def _start_in_temp(tries: int = 2) -> RayCluster:
    """`start_cluster` in a new folder of /tmp: short (Ray's socket paths have a length
    limit), and outside the virtual environment, where Ray refuses a temporary folder (nox
    points TMPDIR there). A cluster that fails to start (each node's start already tried
    START_TRIES times) is started again in a new folder; a missing Ray is not."""
    _ray()
    for attempt in range(1, tries + 1):
        root = pathlib.Path(tempfile.mkdtemp(prefix="lb-ray-", dir=_temp_root()))
        try:
            return start_cluster(root)
        except (ClusterUnavailable, OSError) as exc:
            shutil.rmtree(root, ignore_errors=True)
            if attempt == tries:
                raise
            print(f"the Ray test cluster did not start (try {attempt}): {exc}", file=sys.stderr)
    raise AssertionError("unreachable: the last try raises")


@contextlib.contextmanager
def head_held(cluster: RayCluster) -> Iterator[Callable[[], None]]:
    """The head's CPUs held by an actor of the test's own driver, so that a trial placed
    meanwhile goes to the worker node; yields what lets them go (a trial placed again then
    goes to the head). The driver disconnects on leaving."""
    import ray

    ray.init(address=cluster.address, logging_level="ERROR", namespace="test-blocker")
    try:

        @ray.remote(num_cpus=2, resources={RESOURCES["head"]: 1})
        class Blocker:
            def ready(self) -> bool:
                return True

        blocker = Blocker.remote()  # type: ignore[attr-defined]
        ray.get(blocker.ready.remote())
        yield lambda: ray.kill(blocker)
    finally:
        ray.shutdown()
