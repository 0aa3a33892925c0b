"""Where a workspace lives and how it is laid out.

    <workspace>/registry.sqlite                      the registry
    <workspace>/experiments/<E>/trials/<T>/          one folder per trial:
        checkpoints/  tensorboard/ or csv_logs/  trial.log  run.json

The default workspace is `lightning-bridge` in the user's data directory (`$XDG_DATA_HOME`,
else `~/.local/share` on Linux), where Determined's own local defaults keep checkpoints;
`LIGHTNING_BRIDGE_WORKSPACE` or `--workspace` choose another. Folder names below `experiments/`
are numbers, so nothing in a workspace can be imported as a Python package even when the
workspace is on `sys.path`.
"""

from __future__ import annotations

import os
import pathlib

import platformdirs

ENV_VAR = "LIGHTNING_BRIDGE_WORKSPACE"
REGISTRY_FILE = "registry.sqlite"


def default_workspace() -> pathlib.Path:
    """`$LIGHTNING_BRIDGE_WORKSPACE`, else `lightning-bridge` in the user's data directory."""
    chosen = os.environ.get(ENV_VAR)
    if chosen:
        return pathlib.Path(chosen).expanduser().resolve()
    return pathlib.Path(platformdirs.user_data_dir("lightning-bridge", appauthor=False))


class Workspace:
    """The paths of one workspace folder."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = (
            pathlib.Path(root).expanduser().resolve() if root is not None else default_workspace()
        )

    @property
    def registry_path(self) -> pathlib.Path:
        return self.root / REGISTRY_FILE

    def experiment_dir(self, experiment_id: int) -> pathlib.Path:
        return self.root / "experiments" / str(int(experiment_id))

    def trial_dir(self, experiment_id: int, trial_id: int) -> pathlib.Path:
        return self.experiment_dir(experiment_id) / "trials" / str(int(trial_id))

    def is_default(self) -> bool:
        """Whether this is the workspace commands use without `--workspace`."""
        return self.root == default_workspace()

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"
