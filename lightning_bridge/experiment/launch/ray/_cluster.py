"""Reaching a Ray cluster Ray's way: `--address`, else `RAY_ADDRESS`, else the address the
experiment recorded, else `auto` (the cluster this machine belongs to).

`ray.init` on an address where nothing listens waits minutes before it fails, so the address
is probed first (a TCP connection to the cluster's GCS, or to its Ray Client server for
`ray://HOST:PORT`): a wrong or dead address is refused at once, before anything is recorded.

A cluster with Ray's token authentication (`RAY_AUTH_MODE=token`, on by default from Ray
2.61) is reached with the token Ray finds: `RAY_AUTH_TOKEN`, the file `RAY_AUTH_TOKEN_PATH`
names, or `~/.ray/auth_token`. Where a token is there and `RAY_AUTH_MODE` is not set, the
connection sends it (Ray 2.60 sends it only to a cluster it finds by `auto`); a token the
cluster refuses, or none, is one line naming where the token goes (`TokenAuth`). The token
never leaves Ray's hands: no argument list, output or file of the bridge's holds it.

Ray ends a driver whose cluster went away (60 s after its GCS stopped answering, with a
fatal log line). `ClusterWatch` notices first, by probing the GCS every second, so the
coordinator can record its trials' end and say so in one message before that.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from lightning_bridge._errors import InvalidArgumentError

NAMESPACE = "lightning-bridge"
_PROBE_TIMEOUT_S = 5.0
# Ray writes the address of the cluster this machine's node belongs to here (`auto`).
_CURRENT_CLUSTER = pathlib.Path("/tmp/ray/ray_current_cluster")


def import_ray() -> Any:
    """The `ray` module; missing: the extra that installs it, in one message. A token found
    is sent from the first import on (`TokenAuth.send`: Ray reads its mode as it loads)."""
    if "ray" not in sys.modules:
        TokenAuth().send()
    try:
        import ray
    except ImportError:
        raise InvalidArgumentError(
            "--launcher ray needs Ray: pip install 'lightning-bridge[ray]' (on this machine and "
            "in the Python environment of every node of the cluster)"
        ) from None
    return ray


def draining_nodes() -> dict[str, int]:
    """The cluster's nodes being drained (`ray drain-node`, an autoscaler's preemption): their
    node ids (hex) and deadlines (ms since the epoch, 0 for none), read where Ray Train's own
    preemption watcher reads them; {} where this Ray release cannot tell."""
    ray = import_ray()
    try:
        return {str(k): int(v) for k, v in ray._private.state.state.get_draining_nodes().items()}
    except Exception:  # noqa: BLE001 - a release without it, a GCS busy: no drain seen now
        return {}


def cluster_address(recorded: str | None = None) -> str:
    """The address to reach: `RAY_ADDRESS` (where the command line's `--address` is put),
    else `recorded` (the experiment's), else `auto`."""
    for candidate in (os.environ.get("RAY_ADDRESS"), recorded):
        if candidate and candidate.strip():
            return candidate.strip()
    return "auto"


_AUTH_MODE = "RAY_AUTH_MODE"
_TOKEN_ENV = "RAY_AUTH_TOKEN"
_TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
_DEFAULT_TOKEN = pathlib.Path("~/.ray/auth_token")
# What Ray says when the cluster refuses a connection's token (its GCS's gRPC status, its
# Ray Client's error), in its log or its exception.
_REFUSED = ("Unauthenticated", "InvalidAuthToken", "AuthenticationError", "authentication token")


class TokenAuth:
    """The token this process reaches the cluster with, as Ray looks for it (see the module
    docstring): where it was found, never its value."""

    def __init__(self, environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
        self._environ = environ
        self.mode = (environ.get(_AUTH_MODE) or "").strip().lower()
        self.source = self._find()

    def _find(self) -> str | None:
        if (self._environ.get(_TOKEN_ENV) or "").strip():
            return _TOKEN_ENV
        named = (self._environ.get(_TOKEN_PATH_ENV) or "").strip()
        if named:
            return f"{_TOKEN_PATH_ENV} ({named})" if _readable(pathlib.Path(named)) else None
        default = _DEFAULT_TOKEN.expanduser()
        return str(default) if _readable(default) else None

    def send(self) -> None:
        """Send the token found to the cluster: `RAY_AUTH_MODE=token` in this process where
        it is not set (as Ray 2.61 does by default), before Ray is imported (it reads the
        mode as it loads)."""
        if not self.mode and self.source is not None:
            self._environ[_AUTH_MODE] = "token"
            self.mode = "token"

    def check(self, address: str) -> None:
        """Refuse `RAY_AUTH_MODE=token` with no token to send to the cluster at `address`."""
        if self.mode == "token" and self.source is None:
            raise InvalidArgumentError(
                f"--launcher ray: {_AUTH_MODE}=token but no Ray token was found to send to "
                f"the cluster at {address}; " + self.how_to_fix()
            )

    def how_to_fix(self) -> str:
        return (
            f"give the cluster's token in {_TOKEN_ENV}, in a file named by {_TOKEN_PATH_ENV} or "
            f"in {_DEFAULT_TOKEN} (`ray get-auth-token` on the head node prints it), or set "
            f"{_AUTH_MODE}=disabled for a cluster without token authentication"
        )

    def refused(self, address: str) -> InvalidArgumentError:
        sent = f"the token from {self.source}" if self.source else "no token"
        return InvalidArgumentError(
            f"--launcher ray: the Ray cluster at {address} refused the connection: it needs "
            f"its authentication token and this command sent {sent}; " + self.how_to_fix()
        )

    def redact(self, text: str) -> str:
        """`text` without the token's value (a message built from Ray's)."""
        token = (self._environ.get(_TOKEN_ENV) or "").strip()
        return text.replace(token, "***") if token else text


def _readable(path: pathlib.Path) -> bool:
    try:
        return bool(path.read_text().strip())
    except OSError:
        return False


@contextlib.contextmanager
def _stderr_kept(kept: list[str]) -> Iterator[None]:
    """Ray's native log lines on this process's stderr (file descriptor 2) while connecting
    go to `kept` (shown again unless the connection is refused in one line)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept.append(held.read().decode(errors="replace"))


def _how_to_fix(address: str) -> str:
    return (
        f"check the address (--address or RAY_ADDRESS: HOST:PORT of the head's GCS, 6379 by "
        f"default, or ray://HOST:10001 through Ray Client) and that the cluster runs "
        f"(`ray status --address {address}`; start one with `ray start --head`)"
    )


def _host_port(address: str, default_port: int) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host:
        return address, default_port
    if not port.isdigit():
        raise InvalidArgumentError(
            f"--launcher ray: the Ray address {address!r} is not HOST:PORT; " + _how_to_fix(address)
        )
    return host.strip("[]"), int(port)


def resolve(address: str) -> str:
    """`auto`: the address of the cluster this machine belongs to (Ray's note of it)."""
    if address != "auto":
        return address
    try:
        noted = _CURRENT_CLUSTER.read_text().strip()
    except OSError:
        noted = ""
    if not noted:
        raise InvalidArgumentError(
            "--launcher ray: no Ray cluster runs on this machine (address 'auto'); give the "
            "cluster's address with --address HOST:PORT or RAY_ADDRESS (ray://HOST:10001 from "
            "outside it), or start one with `ray start --head`"
        )
    return noted


def unanswered(address: str) -> str | None:
    """Why nothing answers at the cluster's address (its GCS, or its Ray Client server for
    `ray://`), in a few words; None when something does."""
    target = address.removeprefix("ray://")
    host, port = _host_port(target, 10001 if address.startswith("ray://") else 6379)
    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def probe(address: str) -> None:
    """Refuse an address where no Ray cluster answers (InvalidArgumentError, one line naming
    the address and the fix), in seconds rather than `ray.init`'s minutes."""
    reason = unanswered(address)
    if reason is not None:
        raise InvalidArgumentError(
            f"--launcher ray: no Ray cluster answers at {address} ({reason}); "
            + _how_to_fix(address)
        )


def connect(address: str, namespace: str = NAMESPACE) -> str:
    """Connect this process to the cluster at `address` (`auto` resolved), once; the address
    connected to. A wrong or dead address is refused before `ray.init` (see `probe`)."""
    ray = import_ray()
    resolved = resolve(address)
    if ray.is_initialized():
        return resolved
    probe(resolved)
    auth = TokenAuth()
    auth.check(resolved)
    said: list[str] = []
    try:
        with _stderr_kept(said):
            ray.init(
                address=resolved,
                namespace=namespace,
                logging_level="ERROR",
                log_to_driver=False,
                configure_logging=False,
            )
    except Exception as exc:  # noqa: BLE001 - Ray's own connection errors
        seen = f"{type(exc).__name__}: {exc} {''.join(said)}"
        if any(word in seen for word in _REFUSED):
            raise auth.refused(resolved) from None
        first = str(exc).splitlines()[0] if str(exc) else ""
        hint = (
            f" (a cluster with token authentication answers a token it refuses so too: "
            f"{auth.how_to_fix()})"
            if resolved.startswith("ray://")
            else ""
        )
        raise InvalidArgumentError(
            auth.redact(
                f"--launcher ray: cannot connect to the Ray cluster at {resolved} "
                f"({type(exc).__name__}: {first}); " + _how_to_fix(resolved) + hint
            )
        ) from None
    sys.stderr.write(auth.redact("".join(said)))
    return resolved


def disconnect() -> None:
    ray = import_ray()
    with contextlib.suppress(Exception):
        ray.shutdown()


class ClusterWatch:
    """Probe the cluster's GCS (or Ray Client server) once a second from a thread; after
    `grace_s` seconds without an answer, call `on_lost(reason)` once (see the module
    docstring). Ended with `stop`."""

    def __init__(self, address: str, on_lost: Callable[[str], None], grace_s: float = 5.0) -> None:
        self.address = address
        self._on_lost = on_lost
        self._grace_s = grace_s
        self._stop = threading.Event()
        self.lost: str | None = None
        self._thread = threading.Thread(target=self._run, name="ray-cluster-watch", daemon=True)

    def start(self) -> ClusterWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        since: float | None = None
        while not self._stop.wait(1.0):
            reason = unanswered(self.address)
            if reason is None:
                since = None
                continue
            now = time.monotonic()
            since = now if since is None else since
            if now - since >= self._grace_s and not self._stop.is_set():
                self.lost = f"its head stopped answering: {reason}"
                self._on_lost(self.lost)
                return
