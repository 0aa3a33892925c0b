"""What `lightning-bridge run` tells a script entrypoint, the way a cluster tells a trial.

The runner writes the resolved run (experiment config, hyperparameters, trial seed, the
checkpoint to continue from, its command-line engine settings, and the trial's record: its
folder, log file and ids in the workspace's registry) to a JSON file and names it in
`LIGHTNING_BRIDGE_EXPERIMENT`. `determined.get_cluster_info()` (mapped onto `get_cluster_info`
here) answers from it, `init()` takes its values as defaults for the arguments a script leaves
out, and `Trainer.fit` records the trial's metrics and checkpoints where it says.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
from typing import Any

ENV_VAR = "LIGHTNING_BRIDGE_EXPERIMENT"


class TrialInfo:
    """The trial part of `ClusterInfo`: hyperparameters, seed and the `data` section."""

    def __init__(self, run: dict[str, Any]) -> None:
        self.hparams: dict[str, Any] = dict(run.get("hparams") or {})
        self.trial_seed: int = int(run.get("trial_seed") or 0)
        self.user_data: dict[str, Any] = dict((run.get("config") or {}).get("data") or {})
        record = run.get("record") or {}
        self.trial_id = int(record.get("trial_id", 1))
        self.experiment_id = int(record.get("experiment_id", 1))
        self._config: dict[str, Any] = dict(run.get("config") or {})

    @property
    def config(self) -> dict[str, Any]:
        return self._config


class ClusterInfo:
    """The subset of Determined's `ClusterInfo` a training script reads."""

    task_type = "TRIAL"

    def __init__(self, run: dict[str, Any]) -> None:
        self.trial = TrialInfo(run)
        self.latest_checkpoint: str | None = run.get("latest_checkpoint")

    @property
    def container_rank(self) -> int:
        """This process's node rank (one node here, so 0 unless a launcher says otherwise)."""
        return int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")) or 0)

    @property
    def user_data(self) -> dict[str, Any]:
        """The experiment config's `data` section (as on Determined's `ClusterInfo`)."""
        return self.trial.user_data

    @property
    def container_addrs(self) -> list[str]:
        """The addresses of the trial's nodes: this machine."""
        return ["127.0.0.1"]

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


@functools.lru_cache(maxsize=1)
def _load(path: str) -> dict[str, Any]:
    data = json.loads(pathlib.Path(path).read_text())
    return data if isinstance(data, dict) else {}


def runner_run() -> dict[str, Any] | None:
    """The run the runner described, or None when this process was not started by it."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return None
    return _load(path)


def get_cluster_info() -> ClusterInfo | None:
    """`determined.get_cluster_info()` for a script run by `lightning-bridge run`."""
    run = runner_run()
    return None if run is None else ClusterInfo(run)


def init_defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`init()`'s arguments with the runner's values filled in where the script left the
    default: hparams, exp_conf, aggregation_frequency, accelerator, devices, strategy,
    precision, the trial's folders (run_dir for logs, checkpoint_dir) and code_dir (the
    experiment folder checkpoints carry a copy of)."""
    run = runner_run()
    if run is None:
        return kwargs
    out = dict(kwargs)
    if out.get("hparams") is None:
        out["hparams"] = dict(run.get("hparams") or {})
    if out.get("exp_conf") is None:
        out["exp_conf"] = dict(run.get("config") or {})
    engine = run.get("engine") or {}
    for name, default in (
        ("aggregation_frequency", 1),
        ("accelerator", "auto"),
        ("devices", None),
        ("strategy", "auto"),
        ("precision", None),
    ):
        if out.get(name, default) == default and engine.get(name) is not None:
            out[name] = engine[name]
    for name in ("run_dir", "checkpoint_dir"):
        if out.get(name) is None and run.get(name):
            out[name] = run[name]
    if out.get("code_dir") is None and run.get("context_dir"):
        out["code_dir"] = run["context_dir"]
    return out


def fit_defaults(max_length: Any, test_mode: bool) -> tuple[Any, bool]:
    """`fit()`'s `max_length` (the config's searcher length when the script gives none) and
    `test_mode` (on when the runner was given `--test`)."""
    run = runner_run()
    if run is None:
        return max_length, test_mode
    if max_length is None and run.get("max_length"):
        from lightning_bridge.contract._units import Batch, Epoch

        unit, value = run["max_length"]
        max_length = Epoch(int(value)) if unit == "epochs" else Batch(int(value))
    return max_length, (True if run.get("test_mode") else test_mode)


def resume_defaults(trust: bool, warm_start: bool | None) -> tuple[bool, bool | None]:
    """`fit()`'s `trust_checkpoint` (on when the runner was given `--trust-checkpoint`) and
    `warm_start` (on when the run starts from `searcher.source_checkpoint_uuid` /
    `source_trial_id` rather than a checkpoint of its own)."""
    run = runner_run()
    if run is None:
        return trust, warm_start
    if run.get("trust_checkpoint"):
        trust = True
    if warm_start is None and run.get("warm_start"):
        warm_start = True
    return trust, warm_start
