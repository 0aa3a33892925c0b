"""`--launcher ray` against a cluster with Ray's token authentication (the test cluster of
`_ray_cluster` runs with `RAY_AUTH_MODE=token`, marker `ray`): the token reaches the cluster
from where Ray looks for it, a missing or refused token is one line naming the fix, and the
token shows in nothing the bridge prints or writes, nor in any process's arguments.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

from tests import _folders as sf
from tests._ray_cluster import RayCluster, auth_token
from tests.test_ray import _experiments, on_ray
from tests.test_slurm import (
    _config,
    _folder,
    _job,
    _shown,
    _trial,
    _trial_batches,
    finish,
)

pytestmark = pytest.mark.ray


def _env_without_token(home: pathlib.Path, **more: str) -> dict[str, str]:
    """A command's environment with no Ray token anywhere (`HOME` an empty folder), and
    `more`."""
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in sf.cli_env().items() if not k.startswith("RAY_AUTH")}
    env.pop("RAY_ADDRESS", None)
    return {**env, "HOME": str(home), **more}


def _argument_lists() -> list[str]:
    """Every process's argument list on this machine, joined."""
    out = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return out


def _files_holding(root: pathlib.Path, text: str) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and text.encode() in path.read_bytes():
            found.append(str(path))
    return found


def test_a_missing_or_refused_token_is_one_line_naming_the_fix(
    tmp_path: pathlib.Path, ray_cluster: RayCluster
) -> None:
    """A wrong token, no token (the cluster refuses both), `RAY_AUTH_MODE=token` with no token
    to send (refused before connecting, through Ray Client too): exit 2, one line naming the
    cluster and where the token goes, the wrong token not shown, nothing recorded."""
    path = _folder(tmp_path, _config())
    wrong = "0" * 64
    home = tmp_path / "home"
    cases = (
        (ray_cluster.address, {"RAY_AUTH_TOKEN": wrong}, "refused the connection"),
        (ray_cluster.address, {}, "this command sent no token"),
        (ray_cluster.client_address, {"RAY_AUTH_MODE": "token"}, "no Ray token was found"),
    )
    for number, (address, more, message) in enumerate(cases):
        ws = tmp_path / f"ws{number}"
        done = subprocess.run(
            sf.command(*on_ray(path, ws, "--address", address)),
            cwd=tmp_path,
            env=_env_without_token(home, **more),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 2, _shown(done)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("lightning-bridge: error:"), lines[0]
        assert message in lines[0] and address in lines[0], lines[0]
        assert "RAY_AUTH_TOKEN" in lines[0] and "ray get-auth-token" in lines[0], lines[0]
        assert wrong not in done.stdout + done.stderr
        assert not _experiments(ws)


def test_the_token_in_ray_auth_token_reaches_the_cluster_through_ray_client_and_nowhere_else(
    tmp_path: pathlib.Path, ray_cluster: RayCluster
) -> None:
    """The token in `RAY_AUTH_TOKEN` alone (no `RAY_AUTH_MODE`, no token file), the cluster
    through Ray Client: the trial runs to its end; while it trains (held at the test's gate
    after 2 batches), no process's arguments hold the token, and after it, neither the
    command's output, `experiment describe`, nor any file in the workspace or the
    experiment's folder."""
    token = auth_token()
    path = _folder(tmp_path, _config())
    ws = tmp_path / "ws"
    env = _env_without_token(tmp_path / "home", RAY_AUTH_TOKEN=token)
    gate = sf.Gate.at(tmp_path / "gate")
    command = sf.command(
        *on_ray(path, ws, "--address", ray_cluster.client_address), *gate.options(2)
    )
    coordinator = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        gate.wait(timeout=600, seen=lambda: _trial_batches(ws))
        sampled = _argument_lists()
        assert any("lightning_bridge _trial" in a for a in sampled), sampled
        assert not [a for a in sampled if token in a]
    finally:
        gate.release()
        out = finish(coordinator)
    assert coordinator.returncode == 0, out[-4000:]
    assert _trial(ws).state == "COMPLETED" and _job(ws).state == "COMPLETED"
    described = subprocess.run(
        sf.command("experiment", "describe", "1", "--json", "--workspace", str(ws)),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert described.returncode == 0, _shown(described)
    assert token not in out + described.stdout + described.stderr
    assert not _files_holding(tmp_path, token)
    assert os.environ.get("RAY_AUTH_TOKEN") is None  # the test process has the file only
