"""The checks before an experiment records anything, in one place and one order, for `run`
(one trial or a search), `search-worker` and `experiment continue`: a refusal there leaves
the workspace as it was, with one message.

In order: the checkpoint storage and the size of the code to snapshot (a new experiment),
the search's storage (a search with `--storage`), the launcher's checks that need no
Lightning (its config section; a cluster's answer and room for the trial), the engine
settings against Lightning (a trial trained from here), the launcher's other checks (its
binaries, what it can place), `--worker-jobs`, the record's file system as the launcher
needs it, and the MLflow tracking server's answer to the command's credentials (a server
that answers 401/403).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.launch._contract import Launcher
from lightning_bridge.experiment.launch._registry import launcher_for
from lightning_bridge.experiment.trials import _experiments
from lightning_bridge.record._workspace import Workspace


def preflight(
    plan: _plan.Plan,
    workspace: Workspace,
    *,
    new: bool = False,
    search: bool = False,
    search_storage: str | None = None,
    written: Sequence[pathlib.Path] = (),
    engine: bool = False,
) -> Launcher:
    """Check `plan` before anything is recorded (see the module docstring): `new`, an
    experiment about to be created (its checkpoint storage, its code's size, with `written`
    files the run adds to the workspace); `search`, a search's (Optuna there, the options'
    `--worker-jobs` possible), `search_storage` the storage it names, to reach; `engine`,
    the engine settings of a trial trained from here. Raises the first refusal (a
    BridgeError); returns the plan's launcher."""
    if new:
        _experiments.check_storage(plan)
    if search:
        from lightning_bridge.search._storage import import_optuna

        import_optuna()
    if search_storage is not None:  # reached before the search is recorded
        from lightning_bridge.search._storage_check import check_search_storage

        check_search_storage(search_storage)
    if new:
        _experiments.check_code(plan, workspace, *written)
    launcher = launcher_for(plan.options.launcher)
    launcher.check_early(plan)
    if engine:
        plan.check_engine()
    launcher.check(plan)
    if search:
        launcher.check_worker_jobs(plan, plan.options.worker_jobs)
    launcher.check_record(workspace)
    _check_tracking(plan, workspace)
    return launcher


def _check_tracking(plan: _plan.Plan, workspace: Workspace) -> None:
    """The mirror's server refusing the command's credentials (`tracking._mirror`)."""
    from lightning_bridge.tracking._settings import mlflow_installed, tracking_uri

    uri = tracking_uri(workspace.root, plan.options.tracking_uri)
    if uri is not None and mlflow_installed():
        from lightning_bridge.tracking._mirror import check_credentials

        check_credentials(uri)
