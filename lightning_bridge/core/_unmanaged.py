"""An unmanaged experiment: a script run anywhere (not by `lightning-bridge run`) that asks to
be recorded, as Determined's `core_v2.init(config=...)` made one on its master.

The chief records a new experiment with one trial in the workspace (`LIGHTNING_BRIDGE_WORKSPACE`,
else the user's default) and every process gets the same `RunDescription` of it, which the
Core API's contexts report to as they do under the command (`CoreRun`): metrics, checkpoints,
how it ended; `experiment list/describe`, `checkpoint list` and the MLflow mirror see it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.core._checkpoint import storage_section
from lightning_bridge.record._workspace import Workspace
from lightning_bridge.translation.services._run_description import (
    RecordConnection,
    RunDescription,
)


def record_unmanaged(
    *,
    name: str | None,
    description: str | None,
    hparams: Mapping[str, Any] | None,
    data: Mapping[str, Any] | None,
    searcher: Mapping[str, Any] | None,
    checkpoint_storage: str | Mapping[str, Any] | None,
    distributed: DistributedContext,
) -> RunDescription:
    """Record a new unmanaged experiment and its trial (the chief); the run every process
    reports to."""
    searcher = dict(searcher or {"name": "single", "metric": "unmanaged"})
    config: dict[str, Any] = {
        "name": name or f"unmanaged-{uuid.uuid4().hex[:8]}",
        "description": description or "",
        "data": dict(data or {}),
        "hyperparameters": dict(hparams or {}),
        "searcher": searcher,
    }
    if checkpoint_storage is not None:
        config["checkpoint_storage"] = storage_section(checkpoint_storage)
    from lightning_bridge.record._registry import Registry

    ids = None
    if distributed.rank == 0:
        with Registry(Workspace()) as registry:
            experiment_id = registry.create_experiment(
                config,
                name=config["name"],
                description=config["description"],
                options={"unmanaged": True},
                searcher_metric=searcher.get("metric"),
                smaller_is_better=bool(searcher.get("smaller_is_better", True)),
            )
            trial_id = registry.create_trial(
                experiment_id, hparams=config["hyperparameters"], seed=None
            )
            ids = (str(registry.workspace.root), experiment_id, trial_id)
    root, experiment_id, trial_id = distributed.broadcast(ids)
    trial_dir = Workspace(root).trial_dir(experiment_id, trial_id)
    trial_dir.mkdir(parents=True, exist_ok=True)
    return RunDescription(
        record=RecordConnection(root, experiment_id, trial_id),
        run_dir=trial_dir,
        checkpoint_dir=trial_dir / "checkpoints",
        log_file=trial_dir / "trial.log",
        config=config,
        raw_config=config,
        hparams=config["hyperparameters"],
        options={"unmanaged": True},
    )
