"""Real servers the tests run against, on the loopback address, started by the tests (fixtures),
never by nox.

- `PostgresServer` (fixture `postgres`, marker ``postgres``): Debian's PostgreSQL. The fixture
  starts one server for the whole test run and hands each test a running one; a test may
  `stop()`, `start()` or `restart()` it (same port, same data, so `url` stays valid). When no
  server can start, the tests that ask for it are skipped with the reason.
- `moto_server()`: moto's S3 protocol server, for a module's fixture.

A new server follows `PostgresServer`'s pattern: a class with `start()`, `stop()`, `restart()`,
`url`, raising `Unavailable` with the reason when it cannot start, and a fixture here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest


class Unavailable(Exception):
    """The server cannot run on this machine; the message says why."""


def free_port() -> int:
    """A port free on 127.0.0.1."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 (held together while they are picked)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def signal_quietly(pid: int, signum: int) -> None:
    """Send `signum` to `pid`; a process already gone is no error."""
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def is_running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def apt_install(packages: list[str], installed: Callable[[], bool]) -> str | None:
    """Debian's `packages` with apt-get, unless `installed()` once the lock is held: one
    apt-get at a time among the fixtures and the nox sessions (which run in two lanes at
    once), under a lock file they share. None on success, else what failed."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open(os.path.join(tempfile.gettempdir(), "lightning-bridge-apt.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed():
            return None
        for command in (
            ["apt-get", "-o", "DPkg::Lock::Timeout=600", "update", "-qq"],
            ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-qq", *packages],
        ):
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                return f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}"
    return None


class PostgresServer:
    """A PostgreSQL server with a data directory of its own (a temporary folder), on 127.0.0.1
    and a free port, trusting local connections as user ``postgres``.

    Debian's ``postgresql`` is installed with apt-get when missing (as root). PostgreSQL
    refuses to run as root, so as root the server runs as the system user `USER` (created when
    missing)."""

    USER = "lightning-bridge-pg"

    def __init__(self) -> None:
        self.folder: pathlib.Path | None = None
        self.port = free_port()
        self.running = False

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def new_database(self) -> str:
        """A new, empty database of the server (a test's record or storage of its own); its
        URL."""
        import uuid

        import sqlalchemy

        name = f"db_{uuid.uuid4().hex[:12]}"
        engine = sqlalchemy.create_engine(
            self.url.replace("postgresql://", "postgresql+psycopg://"),
            isolation_level="AUTOCOMMIT",
        )
        with engine.connect() as connection:
            connection.exec_driver_sql(f"CREATE DATABASE {name}")
        engine.dispose()
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    @staticmethod
    def _binaries() -> pathlib.Path | None:
        """The newest installed PostgreSQL's bin folder (Debian's layout), or None."""
        found = [p.parent for p in pathlib.Path("/usr/lib/postgresql").glob("*/bin/initdb")]
        return max(found, key=lambda b: float(b.parent.name), default=None)

    def _install(self) -> pathlib.Path:
        """The server's binaries, installed first when missing (one install at a time)."""
        if (binaries := self._binaries()) is not None:
            return binaries
        if shutil.which("apt-get") is None:
            raise Unavailable("PostgreSQL is not installed and there is no apt-get to install it")
        if os.geteuid() != 0:
            raise Unavailable(
                "PostgreSQL is not installed and installing it with apt-get needs root"
            )
        failed = apt_install(["postgresql"], installed=lambda: self._binaries() is not None)
        if failed is not None:
            raise Unavailable(failed)
        if (binaries := self._binaries()) is None:
            raise Unavailable("apt-get installed no PostgreSQL server")
        return binaries

    def _run(self, binary: str, *args: str) -> None:
        command = [str(self._install() / binary), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", self.USER, "--", *command]
        # From "/": the server's user may not enter the tests' working directory.
        done = subprocess.run(command, capture_output=True, text=True, cwd="/")
        if done.returncode != 0:
            raise Unavailable(f"{binary} failed: {(done.stderr or done.stdout).strip()}")

    def start(self) -> str:
        """Start the server (the first time: create its data directory); its URL."""
        if self.running:
            return self.url
        if self.folder is None:
            self._install()
            # Not under pytest's temporary folders: their parents are private to this user.
            self.folder = pathlib.Path(tempfile.mkdtemp(prefix="lightning-bridge-pg-"))
            self.folder.chmod(0o755)
            if os.geteuid() == 0:
                try:
                    pwd.getpwnam(self.USER)
                except KeyError:
                    subprocess.run(
                        ["useradd", "--system", "--no-create-home", "--shell",
                         "/usr/sbin/nologin", self.USER],
                        check=True, capture_output=True,
                    )  # fmt: skip
                shutil.chown(self.folder, user=self.USER)
            data = str(self.folder / "data")
            self._run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8")
        options = f"-h 127.0.0.1 -p {self.port} -k {self.folder}"
        log = str(self.folder / "server.log")
        self._run(
            "pg_ctl", "-D", str(self.folder / "data"), "-l", log, "-w", "-o", options, "start"
        )
        self.running = True
        return self.url

    def stop(self) -> None:
        """Stop the server (fast shutdown: open connections are closed); its data stays."""
        if self.running and self.folder is not None:
            self._run("pg_ctl", "-D", str(self.folder / "data"), "-m", "fast", "-w", "stop")
            self.running = False

    def restart(self) -> str:
        """Stop and start again on the same port with the same data; the URL."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and remove its data."""
        with contextlib.suppress(Unavailable):
            self.stop()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="session")
def _postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
    except Unavailable as exc:
        server.close()
        pytest.skip(f"no PostgreSQL server could be started: {exc}")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def postgres(_postgres_server: PostgresServer) -> PostgresServer:
    """The test run's PostgreSQL server, running (started again if a test stopped it)."""
    _postgres_server.start()
    return _postgres_server


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """Run `python -m moto.server` on 127.0.0.1; yields its endpoint URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto's server did not start (exit {process.poll()})")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


S3_KEYS = {"access_key": "test-access", "secret_key": "test-secret"}


def s3_filesystem(endpoint: str) -> Any:
    """An s3fs file system on moto's server (no cached listings)."""
    import s3fs

    return s3fs.S3FileSystem(
        key=S3_KEYS["access_key"],
        secret=S3_KEYS["secret_key"],
        client_kwargs={"endpoint_url": endpoint},
        skip_instance_cache=True,
        use_listings_cache=False,
    )


def s3_storage_section(endpoint: str, bucket: str, prefix: str, **retention: int) -> dict[str, Any]:
    """A ``checkpoint_storage`` config section for a bucket on moto's server."""
    return {
        "type": "s3",
        "bucket": bucket,
        "prefix": prefix,
        "endpoint_url": endpoint,
        **S3_KEYS,
        **retention,
    }
