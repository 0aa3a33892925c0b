"""Checkpoints of the record as a run needs them: found, fetched, retained.

`--resume` names a checkpoint by directory, by uuid (any storage) or as `latest` (the newest
checkpoint of an earlier run of the same config); `experiment continue` takes each unfinished
trial's latest. A checkpoint in an object store is downloaded into the trial's folder first.
A trial's checkpoints are settled before it runs again (what a killed run left half done is
recorded or removed), and a trial run again where it stopped (a requeued Slurm job, a Ray
trial whose node was lost) has its latest named in its run description
(`continue_from_latest`). Retention across the trials of an experiment
(`save_experiment_best`) is applied when a trial ends.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import shutil

from lightning_bridge._errors import InvalidArgumentError, InvalidCheckpointError
from lightning_bridge.checkpoint._storage_backend import CheckpointStorage
from lightning_bridge.checkpoint._storage_config import storage_from_config
from lightning_bridge.contract._units import Epoch
from lightning_bridge.experiment.config._config import recorded_storage
from lightning_bridge.experiment.config._plan import Plan
from lightning_bridge.record._records import Checkpoint, Experiment
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import CheckpointState, TrialState
from lightning_bridge.translation.services._run_description import RunDescription

logger = logging.getLogger("lightning_bridge")


class AlreadyComplete(Exception):
    """`--resume` names the end of a completed trial: there is nothing to continue."""


@dataclasses.dataclass
class Source:
    """A checkpoint to continue from: its local directory once fetched, and its record (None
    for a directory the workspace does not know)."""

    label: str
    directory: pathlib.Path | None = None
    checkpoint: Checkpoint | None = None


def trial_checkpoint_storage(
    registry: Registry, experiment: Experiment, trial_id: int
) -> CheckpointStorage:
    """Where an experiment's checkpoints are stored (the trial's folder by default)."""
    trial_dir = registry.workspace.trial_dir(experiment.id, trial_id)
    section = experiment.config.get("checkpoint_storage")
    return storage_from_config(section, trial_dir / "checkpoints")


def fetch(registry: Registry, checkpoint: Checkpoint, into: pathlib.Path) -> pathlib.Path:
    """A local directory holding the complete checkpoint: where it is, for local storage;
    else downloaded into `into/<uuid>` (reused when an earlier download completed)."""
    experiment = registry.experiment(checkpoint.experiment_id)
    storage = trial_checkpoint_storage(registry, experiment, checkpoint.trial_id)
    local = storage.local_path(checkpoint.uuid)
    if local is not None:
        if not storage.is_complete(checkpoint.uuid):
            raise InvalidArgumentError(
                f"checkpoint {checkpoint.uuid} is recorded but {local} is missing or "
                "incomplete; continue from another checkpoint (lightning-bridge checkpoint list)."
            )
        return local
    target = into / checkpoint.uuid
    if (target / "metadata.json").is_file():
        return target
    shutil.rmtree(target, ignore_errors=True)
    logger.info("Downloading checkpoint %s from %s", checkpoint.uuid, checkpoint.location)
    return storage.fetch(checkpoint.uuid, target)


def _reached(plan: Plan, checkpoint: Checkpoint) -> bool:
    length = plan.config.length("max_length")
    if length is None or plan.options.test_mode:
        return False
    done = checkpoint.epochs if isinstance(length, Epoch) else checkpoint.batches
    return isinstance(length.value, int) and done >= length.value


def named_checkpoint(registry: Registry, value: str, unknown: str, incomplete: str) -> Source:
    """The checkpoint `value` names: a complete checkpoint of the workspace by id, else a
    checkpoint directory. `unknown` is the error when it is neither; `incomplete` (with
    `{state}`) when the id names a checkpoint that never completed."""
    known = registry.checkpoint(value)
    if known is None:
        path = pathlib.Path(value).expanduser()
        if path.is_dir():
            return Source(str(path.resolve()), directory=path.resolve())
        raise InvalidArgumentError(unknown)
    if known.state != CheckpointState.COMPLETED.value:
        raise InvalidArgumentError(incomplete.replace("{state}", known.state.lower()))
    return Source(known.uuid, checkpoint=known)


def resolve_resume(registry: Registry, value: str, plan: Plan, config_path: pathlib.Path) -> Source:
    """The checkpoint `run --resume VALUE` continues from (not fetched yet)."""
    where = registry.workspace.root
    if value == "latest":
        found = None
        for experiment in reversed(registry.experiments()):
            if experiment.config_path != str(config_path):
                continue
            done = registry.checkpoints(experiment_id=experiment.id)
            if done:
                found = max(done, key=lambda c: c.created_at)
                break
        if found is None:
            raise InvalidArgumentError(
                f"--resume latest: no checkpoint of an earlier run of {config_path} in the "
                f"workspace {where}; run it without --resume first (or name a checkpoint "
                "directory or id)."
            )
        checkpoint = found
    else:
        named = named_checkpoint(
            registry,
            value,
            unknown=f"--resume {value}: not a checkpoint directory, nor a checkpoint id in the "
            f"workspace {where}, nor 'latest'; `lightning-bridge checkpoint list` shows "
            "the checkpoints.",
            incomplete=f"--resume {value}: that checkpoint is {{state}}, not complete; "
            "choose another (lightning-bridge checkpoint list).",
        )
        if named.checkpoint is None:
            return named
        checkpoint = named.checkpoint
    trial = registry.trial(checkpoint.trial_id)
    newest = registry.latest_checkpoint(trial.id)
    if (
        trial.state == TrialState.COMPLETED.value
        and newest is not None
        and newest.uuid == checkpoint.uuid
        and _reached(plan, checkpoint)
    ):
        raise AlreadyComplete(
            f"trial {trial.id} of experiment {trial.experiment_id} is complete: its latest "
            f"checkpoint {checkpoint.uuid} is at batch {checkpoint.batches} (epoch "
            f"{checkpoint.epochs}), the end of searcher.max_length. Nothing to continue: raise "
            "searcher.max_length (e.g. --set searcher.max_length.epochs=N) to train it "
            "longer, or run without --resume for a new experiment."
        )
    return Source(checkpoint.uuid, checkpoint=checkpoint)


def settle_checkpoints(registry: Registry, trial_id: int) -> None:
    """Before a trial starts again: finish what a killed run of it left half done.

    A checkpoint is written whole in the trial's folder, then moved into storage and marked
    complete. A kill between the two leaves a complete checkpoint there that nothing lists:
    it is moved into storage now and recorded complete (with the validation metrics of its
    batch), so the trial continues from it and retention counts it. An upload that did not
    finish (its local copy gone) is deleted from storage, as it never was complete."""
    trial = registry.trial(trial_id)
    experiment = registry.experiment(trial.experiment_id)
    storage = trial_checkpoint_storage(registry, experiment, trial_id)
    staging = registry.workspace.trial_dir(experiment.id, trial_id) / "checkpoints"
    every = CheckpointState.UPLOADING, CheckpointState.COMPLETED, CheckpointState.DELETED
    rows = {c.uuid: c for c in registry.checkpoints(trial_id=trial_id, states=every)}
    for local in sorted(staging.iterdir()) if staging.is_dir() else []:
        if local.name.startswith(".") or not local.is_dir():
            continue  # partial saves and pointers are the checkpoint directory's own
        row = rows.get(local.name)
        stored = storage.local_path(local.name)
        in_place = stored is not None and stored.resolve() == local.resolve()
        if row is not None and row.state == CheckpointState.COMPLETED.value and in_place:
            continue
        _settle(registry, trial_id, storage, local, row)
    for checkpoint in registry.checkpoints(trial_id=trial_id, states=(CheckpointState.UPLOADING,)):
        storage.delete(checkpoint.uuid)
        registry.checkpoint_deleted(checkpoint.uuid)
        logger.info(
            "Removed the incomplete checkpoint %s (its upload did not finish)", checkpoint.uuid
        )


def _settle(
    registry: Registry,
    trial_id: int,
    storage: CheckpointStorage,
    local: pathlib.Path,
    row: Checkpoint | None,
) -> None:
    """Move one checkpoint left in the trial's folder into storage, or remove it."""
    # Here, not at the top: reading the record never imports torch.
    from lightning_bridge.checkpoint._safe_load import read_metadata, read_trial_state

    uuid = local.name
    try:
        metadata = read_metadata(local)
        state = read_trial_state(local) if metadata else None
    except InvalidCheckpointError:
        metadata, state = {}, None
    if state is None or (row is not None and row.state == CheckpointState.DELETED.value):
        shutil.rmtree(local, ignore_errors=True)
        why = "deleted by retention" if row is not None else "not a complete checkpoint"
        logger.info("Removed %s, left in the trial's folder by a killed run (%s)", local, why)
        return
    if row is None:
        metrics = [
            m.values
            for m in registry.metrics(trial_id, "validation")
            if m.batches == state.batches_trained
        ]
        registry.add_checkpoint(
            uuid,
            trial_id,
            batches=state.batches_trained,
            epochs=max(state.epochs_trained, 0),
            location=storage.url(uuid),
            metrics=metrics[-1] if metrics else {},
        )
    location = storage.publish(local, uuid)
    registry.checkpoint_completed(uuid)
    logger.info(
        "Checkpoint %s (batch %d) was written but not stored when the trial's process ended; "
        "stored now in %s",
        uuid,
        state.batches_trained,
        location,
    )


def apply_experiment_retention(registry: Registry, experiment_id: int) -> list[str]:
    """Keep each trial's latest and best and the experiment's best checkpoints (the
    experiment's `checkpoint_storage` counts); delete the others. Returns the deleted uuids."""
    experiment = registry.experiment(experiment_id)
    policy = recorded_storage(experiment.config)
    keep_latest = policy.save_trial_latest
    keep_trial_best, keep_experiment_best = policy.save_trial_best, policy.save_experiment_best
    metric = experiment.searcher_metric
    sign = 1.0 if experiment.smaller_is_better else -1.0

    def score(c: Checkpoint) -> float | None:
        value = c.metrics.get(metric) if metric else None
        return sign * float(value) if isinstance(value, (int, float)) else None

    every = registry.checkpoints(experiment_id=experiment_id)
    keep: set[str] = set()
    for trial in registry.trials(experiment_id):
        own = [c for c in every if c.trial_id == trial.id]
        latest = keep_latest if trial.state == TrialState.COMPLETED.value else max(keep_latest, 1)
        keep.update(c.uuid for c in sorted(own, key=lambda c: c.batches)[-latest:] if latest)
        scored = sorted((c for c in own if score(c) is not None), key=lambda c: score(c) or 0.0)
        keep.update(c.uuid for c in scored[:keep_trial_best])
    scored_all = sorted((c for c in every if score(c) is not None), key=lambda c: score(c) or 0.0)
    keep.update(c.uuid for c in scored_all[:keep_experiment_best])
    removed = []
    for checkpoint in every:
        if checkpoint.uuid not in keep:
            trial_checkpoint_storage(registry, experiment, checkpoint.trial_id).delete(
                checkpoint.uuid
            )
            registry.checkpoint_deleted(checkpoint.uuid)
            removed.append(checkpoint.uuid)
    return removed


def continue_from_latest(run: RunDescription, run_file: pathlib.Path) -> RunDescription:
    """Name the trial's latest durable checkpoint in its run description, for a trial run
    again where it stopped (a requeued Slurm job, a Ray trial whose node was lost): the
    description as rewritten (for its caller) and written (for the trial's processes)."""
    assert run.record is not None and run.run_dir is not None
    with Registry(run.record.workspace) as registry:
        trial_id = run.record.trial_id
        settle_checkpoints(registry, trial_id)
        latest = registry.latest_checkpoint(trial_id)
        if latest is None:
            return run  # nothing durable yet: the trial starts over, as the first run did
        registry.archive_metrics_after(trial_id, latest.batches)
        local = fetch(registry, latest, run.run_dir / "restore")
    rewritten = dataclasses.replace(run, latest_checkpoint=str(local), warm_start=None)
    rewritten.write(run_file)
    return rewritten
