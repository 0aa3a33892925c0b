"""A config's secrets reach the trial and nobody else.

`lightning-bridge run` with a secret-bearing S3 config (moto's server) and a token among
`environment.environment_variables`: while the trial is held at a gate every process's
argument list on the machine is sampled; afterwards every file under the workspace and the
experiment folder (but the user's own config file), every object in the bucket and everything
`run`, `experiment list/describe`, `trial logs` and `checkpoint list` printed are searched for
each secret value: only the record and the trial's `run.json` hold them, 0600 in a 0700
workspace. The trial's process did get the token. Workspaces and checkpoints are private, or
group-shared when asked. The same sweep on Slurm and Ray: `test_slurm_environment.py`,
`test_ray_environment.py`."""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import stat
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from lightning_bridge.experiment.cli._main import main
from tests._folders import (  # isolated_imports: an autouse fixture
    FAULT_CONFIG,
    Gate,
    cli_env,
    command,
    fault_folder,
    finish,
    isolated_imports,  # noqa: F401
    run_args,
    start_run,
    workspace,
)
from tests._servers import moto_server, s3_filesystem

BUCKET = "secrets"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        s3_filesystem(url).mkdir(BUCKET)
        yield url


def _proc(pid: int, name: str) -> bytes:
    try:
        return (pathlib.Path("/proc") / str(pid) / name).read_bytes()
    except OSError:  # ended meanwhile
        return b""


def _holding(secrets: list[str], named: dict[str, bytes]) -> list[tuple[str, str]]:
    return [(where, s) for where, data in named.items() for s in secrets if s.encode() in data]


def _bucket_objects(endpoint: str) -> dict[str, bytes]:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="reader",
        aws_secret_access_key="reader",
        region_name="us-east-1",
    )
    objects = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for entry in page.get("Contents", []):
            body = client.get_object(Bucket=BUCKET, Key=entry["Key"])["Body"].read()
            objects[f"s3://{BUCKET}/{entry['Key']}"] = body
    return objects


@dataclasses.dataclass
class SecretRun:
    """An experiment folder whose config holds secrets: S3 keys, and `HF_TOKEN` among its
    variables; its trial is held at `gate`, and writes the digest of the `HF_TOKEN` it got
    to `seen`."""

    folder: pathlib.Path
    secrets: list[str]
    token: str
    gate: Gate
    seen: pathlib.Path

    @classmethod
    def at(cls, root: pathlib.Path, endpoint: str) -> SecretRun:
        access, secret, token = (f"s{uuid.uuid4().hex}" for _ in range(3))
        folder = fault_folder(
            root,
            searcher={**FAULT_CONFIG["searcher"], "max_length": {"batches": 8}},
            min_validation_period={"batches": 4},
            checkpoint_storage={
                "type": "s3",
                "bucket": BUCKET,
                "prefix": root.name,
                "endpoint_url": endpoint,
                "access_key": access,
                "secret_key": secret,
            },
            environment={"environment_variables": [f"HF_TOKEN={token}", "PLAIN=kept"]},
            max_restarts=0,
        )
        gate = Gate.at(root / "gate")
        seen = gate.path / "token.sha256"
        with open(folder / "model_def.py", "a") as model_def:
            model_def.write(
                "\nimport hashlib\n"
                f"pathlib.Path({str(seen)!r}).write_text("
                "hashlib.sha256(os.environ.get('HF_TOKEN', '').encode()).hexdigest())\n"
            )
        return cls(folder, [access, secret, token], token, gate, seen)

    def run(self, *args: str) -> str:
        """`run const.yaml ARGS` held at the gate while every process's argument list on this
        machine is sampled (none holds a secret), then to its end; returns its output."""
        proc = start_run(self.folder, *args, *self.gate.options(5))
        self.gate.wait(seen=lambda: proc.poll())
        sampled = {
            f"/proc/{entry.name}/cmdline": _proc(int(entry.name), "cmdline")
            for entry in pathlib.Path("/proc").iterdir()
            if entry.name.isdigit()
        }
        self.gate.release()
        code, out, err, _ = finish(proc, timeout=300)
        assert code == 0, f"{out}\n{err}"
        assert f"/proc/{proc.pid}/cmdline" in sampled
        assert not _holding(self.secrets, sampled)
        # The trial's process got the token.
        assert self.seen.read_text() == hashlib.sha256(self.token.encode()).hexdigest()
        return out + err

    def check_nobody_else(self, printed: str, endpoint: str, private: tuple[str, ...]) -> None:
        """No secret in what the run printed, what the record's commands print, any file
        under the workspace and the folder (but the user's config file, and the `private`
        files, which must be 0600 in a 0700 workspace), or any object of the bucket."""
        folder, ws = self.folder, workspace(self.folder)
        shown = {"run": printed.encode()}
        for args in (
            ("experiment", "list"),
            ("experiment", "list", "--json"),
            ("experiment", "describe", "1"),
            ("experiment", "describe", "1", "--json"),
            ("trial", "logs", "1"),
            ("trial", "logs", "1", "--json"),
            ("checkpoint", "list"),
            ("checkpoint", "list", "--json"),
        ):
            done = subprocess.run(
                command(*args), env=cli_env(folder), capture_output=True, timeout=120, cwd=folder
            )
            assert done.returncode == 0, done
            shown[" ".join(args)] = done.stdout + done.stderr
        assert b"HF_TOKEN=***" in shown["experiment describe 1 --json"]
        assert b"PLAIN=kept" in shown["experiment describe 1 --json"]
        assert not _holding(self.secrets, shown)

        files = {
            str(p): p.read_bytes()
            for root in (ws, folder)
            for p in root.rglob("*")
            if p.is_file() and p != folder / "const.yaml"
        }
        holders = {pathlib.Path(p) for p, _ in _holding(self.secrets, files)}
        assert {p.name for p in holders} <= set(private), holders
        assert {p: stat.S_IMODE(p.stat().st_mode) for p in holders} == {p: 0o600 for p in holders}
        assert stat.S_IMODE(ws.stat().st_mode) == 0o700
        objects = _bucket_objects(endpoint)
        assert any(k.endswith("load_data.json") for k in objects), sorted(objects)
        assert any(k.endswith("code/const.yaml") for k in objects), sorted(objects)
        assert not _holding(self.secrets, objects)


# Only the record and the trial's description keep the config whole (a continued experiment
# needs the storage's keys): private files, in a private workspace.
RECORD_FILES = ("registry.sqlite", "registry.sqlite-wal", "run.json")


def test_secrets_reach_the_trial_and_nobody_else(tmp_path: pathlib.Path, endpoint: str) -> None:
    run = SecretRun.at(tmp_path, endpoint)
    run.check_nobody_else(run.run(), endpoint, RECORD_FILES)


@pytest.mark.parametrize("shared", [False, True], ids=["private", "group"])
def test_workspace_and_checkpoints_private_or_group_shared(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    monkeypatch.setenv("LIGHTNING_BRIDGE_SHARE_GROUP", "1" if shared else "0")
    searcher = {**FAULT_CONFIG["searcher"], "max_length": {"batches": 4}}
    folder = fault_folder(tmp_path, searcher=searcher)
    assert main(run_args(folder)) == 0
    ws = workspace(folder)
    dirs, files = (0o2770, 0o660) if shared else (0o700, 0o600)
    checkpoints = [p.parent for p in ws.rglob("load_data.json")]
    written = [ws / "registry.sqlite", *ws.rglob("run.json")]
    assert checkpoints and len(written) == 2, sorted(ws.rglob("*"))
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in [ws, *checkpoints, *written]}
    expected = {p: dirs for p in [ws, *checkpoints]} | {p: files for p in written}
    assert modes == expected


def test_config_errors_name_secret_entries_without_their_values(tmp_path: pathlib.Path) -> None:
    access, secret, token = (f"s{uuid.uuid4().hex}" for _ in range(3))
    folder = fault_folder(
        tmp_path,
        checkpoint_storage={"type": "s3", "bucket": "b", "access_key": [access], "secret_key": 7},
        environment={"environment_variables": [f"HF_TOKEN={token}", {"bad": secret}]},
    )
    shown = subprocess.run(
        command(*run_args(folder)), env=cli_env(folder), capture_output=True, text=True
    )
    assert shown.returncode != 0
    for line in ("checkpoint_storage.access_key", "checkpoint_storage.secret_key"):
        assert line in shown.stderr, shown.stderr
    assert "environment.environment_variables" in shown.stderr
    assert not [s for s in (access, secret, token) if s in shown.stdout + shown.stderr]


@pytest.mark.parametrize("scheme", ["mysql", "postgresql"])
def test_a_storage_urls_password_is_not_shown(tmp_path: pathlib.Path, scheme: str) -> None:
    password = f"s{uuid.uuid4().hex}"
    searcher = {"name": "random", "metric": "loss", "max_trials": 2, "max_length": {"batches": 2}}
    hparams = {"global_batch_size": 8, "lr": {"type": "double", "minval": 0.1, "maxval": 0.2}}
    folder = fault_folder(tmp_path, searcher=searcher, hyperparameters=hparams)
    url = f"{scheme}://user:{password}@127.0.0.1:1/searches"  # refused: nothing listens
    shown = subprocess.run(
        command(*run_args(folder), "--storage", url),
        env=cli_env(folder),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode != 0
    assert f"--storage {scheme}://user:***@127.0.0.1:1/searches" in shown.stderr, shown.stderr
    assert password not in shown.stdout + shown.stderr
