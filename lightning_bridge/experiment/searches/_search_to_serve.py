"""A search to serve, as the commands that serve one (`run`, `search-worker`, `experiment
continue`) and a Slurm worker job read it from its record: where its storage is, and the
options its trials run with."""

from __future__ import annotations

import dataclasses
from typing import Any

from lightning_bridge.experiment.config import _plan
from lightning_bridge.record._registry import Registry


def search_storage_url(registry: Registry, experiment_id: int, search: dict[str, Any]) -> str:
    """The storage of a recorded search (its default: a journal file in its folder)."""
    stored = search.get("storage")
    if stored:
        return str(stored)
    return str(registry.workspace.experiment_dir(experiment_id) / "search.journal")


def launched_by(
    recorded: dict[str, Any], launcher: str | None, worker_jobs: int | None = None
) -> _plan.Options:
    """The options a search's trials run with: those the search was started with, its
    launcher and worker jobs among them (not the workspace's default: it is the search's
    choice, as an experiment's own launcher is `experiment continue`'s), unless `launcher`
    (`--launcher`) or `worker_jobs` (`--worker-jobs`) names another (another launcher
    drops the recorded worker jobs)."""
    options = _plan.Options.from_record(recorded)
    if launcher and launcher != options.launcher:
        options = dataclasses.replace(options, launcher=launcher, worker_jobs=None)
    if worker_jobs is not None:
        options = dataclasses.replace(options, worker_jobs=worker_jobs)
    return options
