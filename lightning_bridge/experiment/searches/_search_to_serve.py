"""A search to serve (`SearchToServe`): the one value the commands that serve a search (`run`,
`search-worker`, `experiment continue`, a Slurm worker job) build once and hand to what serves
it (`SearchWorker`, `WorkerJobs`); and how a recorded search is read back: where its storage
is, the options its trials run with."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.config._config import ResolvedConfig
from lightning_bridge.experiment.trials._checkpoints import Source
from lightning_bridge.record._registry import Registry

# A running trial not heard of for this long is taken as lost with its worker and given back.
LOST_AFTER_S = 300.0


@dataclasses.dataclass(frozen=True)
class SearchToServe:
    """A search as its workers serve it: the experiment that records its trials in this
    workspace, its config and code folder, the options its trials run with, its storage, the
    checkpoint each of its trials starts from (a warm start), and how long a trial of another
    worker may go unheard of before it is given back."""

    experiment_id: int
    config: ResolvedConfig
    context_dir: pathlib.Path
    options: _plan.Options
    storage: str
    source: Source | None = None
    lost_after_s: float = LOST_AFTER_S


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
