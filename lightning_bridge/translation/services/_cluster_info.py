"""`determined.get_cluster_info()` for a trial started by `lightning-bridge run`.

A script reads the cluster's answer to learn whether it runs as an experiment's trial: its
hyperparameters, seed, ids, the config's `data` section and the checkpoint to continue from.
Here the answer is the trial's `RunDescription`.
"""

from __future__ import annotations

import os
from typing import Any

from lightning_bridge.translation.services._run_description import RunDescription
from lightning_bridge.translation.services._trial_environment import (
    NODE_ADDRS_ENV,
    TrialEnvironment,
)

__all__ = ["NODE_ADDRS_ENV", "ClusterInfo", "TrialInfo", "get_cluster_info"]


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
        self._config: dict[str, Any] = dict(run.config)

    @property
    def container_rank(self) -> int:
        """This process's node rank (one node here, so 0 unless a launcher says otherwise)."""
        return int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")) or 0)

    @property
    def user_data(self) -> dict[str, Any]:
        """The experiment config's `data` section (as on Determined's `ClusterInfo`)."""
        return self.trial.user_data

    @property
    def slot_ids(self) -> list[int]:
        """The slots of this process's node: `resources.slots_per_trial` shared by the
        trial's nodes (a command not behind Determined's launcher starts that many
        processes itself)."""
        resources = self._config.get("resources") or {}
        slots = int(resources.get("slots_per_trial") or 1)
        return list(range(max(1, slots // max(1, len(self.container_addrs)))))

    @property
    def container_addrs(self) -> list[str]:
        """The addresses of the trial's nodes in node-rank order (Determined gave one per
        container): those its launcher names (`NODE_ADDRS_ENV`), else this machine's."""
        return TrialEnvironment.current().node_addrs

    @property
    def gpu_uuids(self) -> list[str]:
        """The UUIDs of the GPUs this process sees (none on a CPU machine)."""
        import torch

        if not torch.cuda.is_available():
            return []
        return [
            f"GPU-{torch.cuda.get_device_properties(i).uuid}"
            for i in range(torch.cuda.device_count())
        ]


def get_cluster_info() -> ClusterInfo | None:
    """`determined.get_cluster_info()` for a script run by `lightning-bridge run`."""
    run = RunDescription.current()
    return None if run is None else ClusterInfo(run)
