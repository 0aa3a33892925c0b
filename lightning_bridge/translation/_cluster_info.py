"""`determined.get_cluster_info()` for a trial started by `lightning-bridge run`.

A script reads the cluster's answer to learn whether it runs as an experiment's trial: its
hyperparameters, seed, ids, the config's `data` section and the checkpoint to continue from.
Here the answer is the trial's `RunDescription`.
"""

from __future__ import annotations

import os
from typing import Any

from lightning_bridge.translation._run_description import RunDescription


class TrialInfo:
    """The trial part of `ClusterInfo`: hyperparameters, seed and the `data` section."""

    def __init__(self, run: RunDescription) -> None:
        self.hparams: dict[str, Any] = dict(run.hparams)
        self.trial_seed: int = run.trial_seed
        self.user_data: dict[str, Any] = dict(run.config.get("data") or {})
        self.trial_id = run.trial_id
        self.experiment_id = run.experiment_id
        self._config: dict[str, Any] = dict(run.config)

    @property
    def config(self) -> dict[str, Any]:
        return self._config


class ClusterInfo:
    """The subset of Determined's `ClusterInfo` a training script reads."""

    task_type = "TRIAL"

    def __init__(self, run: RunDescription) -> None:
        self.trial = TrialInfo(run)
        self.latest_checkpoint: str | None = run.latest_checkpoint

    @property
    def container_rank(self) -> int:
        """This process's node rank (one node here, so 0 unless a launcher says otherwise)."""
        return int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")) or 0)


def get_cluster_info() -> ClusterInfo | None:
    """`determined.get_cluster_info()` for a script run by `lightning-bridge run`."""
    run = RunDescription.current()
    return None if run is None else ClusterInfo(run)
