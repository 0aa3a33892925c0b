"""The services a Trainer's fit reports to and checkpoints through, built once for both.

`pytorch.Trainer` (a `PyTorchTrial` on Fabric) and `deepspeed.Trainer` (a `DeepSpeedTrial` on
DeepSpeed's engines) run the same `FitLoop`; around it they need the same parts: the
checkpoint policy settled against the config, the run's record and its search's report under
`lightning-bridge run`, checkpoint retention, the MLflow mirror, the `Checkpointer`, and,
after a stop request, the line saying where the run stopped and how to continue it. Each
Trainer builds its engine; this module builds the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NoReturn

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.checkpoint._retention import CheckpointRetention
from lightning_bridge.contract._config_values import ConfigValues
from lightning_bridge.translation._observer import FitObserver, FitObservers
from lightning_bridge.translation.fit._checkpointer import CHECKPOINT_POLICIES, Checkpointer
from lightning_bridge.translation.fit._schedule import Schedule

if TYPE_CHECKING:  # loaded only under `lightning-bridge run` (see runner_reports)
    from lightning_bridge.translation.services._mlflow_mirror import MlflowMirror
    from lightning_bridge.translation.services._run_description import RunDescription
    from lightning_bridge.translation.services._run_record import RunRecord
    from lightning_bridge.translation.services._search_report import SearchReport

logger = logging.getLogger("lightning_bridge")


def settled_policy(checkpoint_policy: str, config: ConfigValues) -> str:
    """`checkpoint_policy` checked; "best" without a searcher metric to compare validations
    by is "all" (with a warning)."""
    if checkpoint_policy not in CHECKPOINT_POLICIES:
        raise InvalidArgumentError(
            f"checkpoint_policy must be one of {', '.join(CHECKPOINT_POLICIES)}; got "
            f"{checkpoint_policy!r}."
        )
    if checkpoint_policy == "best" and not config.searcher_metric:
        logger.warning(
            "checkpoint_policy='best' needs searcher.metric in the experiment config to "
            "compare validations; checkpointing after every validation ('all') instead."
        )
        return "all"
    return checkpoint_policy


@dataclasses.dataclass(frozen=True)
class FitServices:
    """What a fit reports to and checkpoints through (the record and the search report are
    None outside `lightning-bridge run`); `schedule` is the fit's, with a search's rungs."""

    record: RunRecord | None
    search: SearchReport | None
    checkpointer: Checkpointer
    schedule: Schedule


def fit_services(
    run: RunDescription | None,
    config: ConfigValues,
    ckpt_dir: pathlib.Path,
    *,
    schedule: Schedule,
    checkpoint_policy: str,
    observers: FitObservers,
    own_observers: Iterable[FitObserver],
    is_chief: bool,
    test_mode: bool,
) -> FitServices:
    """The fit's services: the run's record and search report, retention (the chief's
    record removes what it drops), the observers (the Trainer's own first, then the record,
    the search report and the MLflow mirror) and the `Checkpointer` notifying them."""
    record, search = runner_reports(run, config, ckpt_dir, test_mode)
    chief_record = record if record is not None and is_chief else None
    retention = CheckpointRetention.from_section(
        config.checkpoint_storage,
        smaller_is_better=config.smaller_is_better,
        remove=chief_record.remove if chief_record is not None else None,
    )
    if retention is not None and chief_record is not None:
        chief_record.track_kept(retention)
    if search is not None:
        schedule = schedule.with_rungs(*search.rungs())
    for observer in (*own_observers, record, search, mlflow_mirror(run)):
        if observer is not None:
            observers.add(observer)
    checkpointer = Checkpointer(
        ckpt_dir,
        policy=checkpoint_policy,
        searcher_metric=config.searcher_metric,
        smaller_is_better=config.smaller_is_better,
        retention=retention,
        observer=observers,
    )
    return FitServices(record, search, checkpointer, schedule)


def stopped(
    preempted_by: str,
    services: FitServices,
    ckpt_dir: pathlib.Path,
    batches_trained: int,
    is_chief: bool,
) -> NoReturn:
    """End a fit a stop request ended: the chief says where it stopped, which checkpoint it
    wrote and how to continue (under the command: its continue command); exit code 0."""
    saved = services.checkpointer.saved
    record = services.record
    where: Any = saved[-1] if saved else ckpt_dir
    how = f"Continue with fit(latest_checkpoint={str(where)!r})."
    if record is not None and record.continue_command:
        # Under the command: its own continue command, the checkpoint where it is kept.
        if saved:
            where = record.storage.url(saved[-1].name)
        how = f"Continue with: {record.continue_command}"
    if is_chief:
        print(
            f"Stopped by {preempted_by} after batch {batches_trained}; checkpoint {where}. {how}",
            flush=True,
        )
    raise SystemExit(0)


def runner_reports(
    run: RunDescription | None,
    config: ConfigValues,
    ckpt_dir: pathlib.Path,
    test_mode: bool,
) -> tuple[RunRecord | None, SearchReport | None]:
    """The run's record and its search report when `lightning-bridge run` started the fit
    (None, None otherwise: their modules, with SQLAlchemy and pydantic, are not even loaded)."""
    if run is None:
        return None, None
    from lightning_bridge.translation.services._run_record import record_from_runner
    from lightning_bridge.translation.services._search_report import search_from_runner

    record = record_from_runner(run, config, ckpt_dir)
    return record, None if test_mode else search_from_runner(run)


def mlflow_mirror(run: RunDescription | None) -> MlflowMirror | None:
    """The run's MLflow mirror when `lightning-bridge run` started the fit and a tracking URI
    (or MLflow's embedded store) is configured."""
    if run is None:
        return None
    from lightning_bridge.translation.services._mlflow_mirror import mirror_from_runner

    return mirror_from_runner(run)
