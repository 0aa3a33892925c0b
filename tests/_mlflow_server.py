"""A real `mlflow server` for the mlflow tests: SQLite backend, artifacts in a temporary
folder, on 127.0.0.1 at a free port; it can be stopped and started again on the same port and
store (the outage test). Tests using it are skipped, with the reason, where MLflow (the full
package, with its server) is not installed.

The server needs basic authentication (`--app-name basic-auth`, its users in a SQLite file of
its own): its admin user's name and a password made for the session are what a client sends
(`credentials`: `MLFLOW_TRACKING_USERNAME` / `MLFLOW_TRACKING_PASSWORD`). While the session's
server runs, this process's environment holds them, so that MLflow's client here and the
commands a test starts reach it as a user's shell with the credentials would."""

from __future__ import annotations

import base64
import contextlib
import http.client
import http.server
import importlib.util
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

from tests._servers import free_port

HAVE_MLFLOW_SERVER = (
    importlib.util.find_spec("mlflow") is not None
    and importlib.util.find_spec("mlflow.server") is not None
    and importlib.util.find_spec("flask") is not None
)
SKIP_REASON = "needs MLflow with its server: pip install mlflow (the mlflow nox session does)"


class MlflowServer:
    """`mlflow server` on 127.0.0.1 (see the module docstring)."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.username = "admin"
        self.password = secrets.token_urlsafe(24)

    @property
    def credentials(self) -> dict[str, str]:
        """The environment a client reaches the server with."""
        return {
            "MLFLOW_TRACKING_USERNAME": self.username,
            "MLFLOW_TRACKING_PASSWORD": self.password,
        }

    def _auth_config(self) -> pathlib.Path:
        """The basic-auth app's settings: its users' store in the server's folder."""
        path = self.root / "basic_auth.ini"
        path.write_text(
            "[mlflow]\n"
            "default_permission = READ\n"
            f"database_uri = sqlite:///{self.root / 'basic_auth.db'}\n"
            f"admin_username = {self.username}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        )
        return path

    def start(self, timeout: float = 120.0) -> None:
        (self.root / "artifacts").mkdir(parents=True, exist_ok=True)
        mlflow = shutil.which("mlflow", path=str(pathlib.Path(sys.executable).parent))
        args = [mlflow] if mlflow else [sys.executable, "-m", "mlflow"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        # No background job runner (its worker processes): the tests track and register only.
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(self._auth_config())
        env["MLFLOW_AUTH_ADMIN_PASSWORD"] = self.password  # the admin's, on the first start
        env["MLFLOW_FLASK_SERVER_SECRET_KEY"] = self.password  # the app's CSRF key
        with open(self.log, "ab") as out:
            self._process = subprocess.Popen(
                [
                    *args, "server",
                    "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
                    "--artifacts-destination", str(self.root / "artifacts"),
                    "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
                    "--app-name", "basic-auth",
                ],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"mlflow server exited:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    if not HAVE_MLFLOW_SERVER:
        pytest.skip(SKIP_REASON)
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    saved = {name: os.environ.get(name) for name in server.credentials}
    os.environ.update(server.credentials)
    try:
        yield server
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def logged_in_proxy(uri: str, username: str, password: str) -> Iterator[str]:
    """A reverse proxy on 127.0.0.1 in front of the server at `uri` that adds the user's basic
    authentication to every request, as a site's proxy with its own login does; its address.

    For the browser: credentials in a page's URL log the page itself in, but not the
    requests the page's scripts make (MLflow's UI fetches its runs and models from the API), so
    the browser reaches the basic-auth server through this proxy."""
    target = urllib.parse.urlsplit(uri)
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    hop_by_hop = {"connection", "keep-alive", "transfer-encoding", "upgrade", "host"}

    class Forward(http.server.BaseHTTPRequestHandler):
        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in hop_by_hop}
            headers["Authorization"] = f"Basic {token}"
            upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
            finally:
                upstream.close()
            self.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in hop_by_hop | {"content-length"}:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _forward

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
