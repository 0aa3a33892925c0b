"""A real S3 protocol server for the tests: moto's server mode on the loopback address,
started and stopped by the tests that use it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

KEYS = {"access_key": "test-access", "secret_key": "test-secret"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """Run `python -m moto.server` on 127.0.0.1; yields its endpoint URL."""
    port = _free_port()
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


def filesystem(endpoint: str) -> Any:
    """An s3fs file system on the server (no cached listings)."""
    import s3fs

    return s3fs.S3FileSystem(
        key=KEYS["access_key"],
        secret=KEYS["secret_key"],
        client_kwargs={"endpoint_url": endpoint},
        skip_instance_cache=True,
        use_listings_cache=False,
    )


def storage_section(endpoint: str, bucket: str, prefix: str, **retention: int) -> dict[str, Any]:
    return {
        "type": "s3",
        "bucket": bucket,
        "prefix": prefix,
        "endpoint_url": endpoint,
        **KEYS,
        **retention,
    }
