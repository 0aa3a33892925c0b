"""Where the mirror sends the record: the tracking URI, and MLflow's availability.

The URI is, first found: the run's `--tracking-uri` (kept in the experiment's record, so
`continue` and `sync` use it too), `MLFLOW_TRACKING_URI`, the workspace's setting
(`<workspace>/workspace.json`: `{"tracking_uri": "http://host:5000"}`, or the older
`<workspace>/mlflow.json` of the same form), else, when MLflow is
installed, the workspace's embedded store (`sqlite:///<workspace>/mlflow.db`, artifacts in
`<workspace>/mlartifacts`). `--tracking-uri off` (or `"off"` in the setting) turns the mirror
off; `LIGHTNING_BRIDGE_MLFLOW=off` turns the embedded default off.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shlex
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.record._settings import WorkspaceSettings

SETTINGS_FILE = "mlflow.json"
EMBEDDED_DB = "mlflow.db"
EMBEDDED_ARTIFACTS = "mlartifacts"
SWITCH_ENV = "LIGHTNING_BRIDGE_MLFLOW"
EXTRA_HINT = "pip install 'lightning-bridge[mlflow]'"
OFF = "off"


def mlflow_installed() -> bool:
    """Whether MLflow's client can be imported (without importing it: that takes seconds)."""
    return importlib.util.find_spec("mlflow") is not None


def require_mlflow(what: str) -> Any:
    """The `mlflow` module; InvalidArgumentError naming the extra when it is missing."""
    try:
        import mlflow
    except ImportError:
        raise InvalidArgumentError(
            f"{what} needs MLflow's client, which is not installed: {EXTRA_HINT}"
        ) from None
    return mlflow


def workspace_setting(workspace: pathlib.Path) -> str | None:
    """The workspace's `tracking_uri` setting (None when it has none): `workspace.json`'s,
    else the older `mlflow.json`'s."""
    if (uri := WorkspaceSettings.read(workspace).tracking_uri) is not None:
        return uri
    path = workspace / SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        value = data.get("tracking_uri") if isinstance(data, dict) else None
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(
            f"{path} is not a JSON object with a tracking_uri ({exc}); fix or delete it."
        ) from None
    return str(value) if value else None


def embedded_uri(workspace: pathlib.Path) -> str:
    return f"sqlite:///{workspace / EMBEDDED_DB}"


def is_embedded(uri: str, workspace: pathlib.Path) -> bool:
    return uri == embedded_uri(workspace)


def tracking_uri(workspace: pathlib.Path, given: str | None = None) -> str | None:
    """The URI the record of `workspace` is mirrored to (None: no mirror)."""
    for value in (given, os.environ.get("MLFLOW_TRACKING_URI"), workspace_setting(workspace)):
        if value:
            return None if value.strip().lower() == OFF else value
    if os.environ.get(SWITCH_ENV, "").strip().lower() in (OFF, "0", "false", "no"):
        return None
    return embedded_uri(workspace) if mlflow_installed() else None


def artifact_location(uri: str, workspace: pathlib.Path, experiment_id: int) -> str | None:
    """Where the embedded store keeps an experiment's artifacts (a server decides its own)."""
    if not is_embedded(uri, workspace):
        return None
    return (workspace / EMBEDDED_ARTIFACTS / str(experiment_id)).as_uri()


def ui_line(uri: str, workspace: pathlib.Path) -> str:
    """How to look at the mirror: the UI command of the embedded store, or the server."""
    if is_embedded(uri, workspace):
        return (
            f"MLflow: mlflow ui --backend-store-uri {shlex.quote(uri)} "
            f"--default-artifact-root {shlex.quote(str(workspace / EMBEDDED_ARTIFACTS))}"
        )
    return f"MLflow: {uri}"
