"""The checkpoint a new trial starts from: Determined's warm start.

`searcher.source_checkpoint_uuid` names a checkpoint of the workspace by id (in any storage; a
path to a checkpoint directory also works), `searcher.source_trial_id` a trial of the
workspace whose newest complete checkpoint is used. The trial then starts a new run from that
checkpoint: weights, optimizer and RNG states, the batch count from 0. `--resume` is not a warm
start: it continues the checkpoint it names (`_checkpoints.resolve_resume`).
"""

from __future__ import annotations

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment.trials._checkpoints import Source, named_checkpoint
from lightning_bridge.record._registry import Registry
from lightning_bridge.search import SearcherConfig


def warm_start_source(registry: Registry, searcher: SearcherConfig) -> Source | None:
    """The source checkpoint the config's searcher names (not fetched yet), or None."""
    where = registry.workspace.root
    uuid = searcher.source_checkpoint_uuid
    if uuid is not None:
        return named_checkpoint(
            registry,
            str(uuid),
            unknown=f"searcher.source_checkpoint_uuid: {uuid!r} is not a checkpoint id in the "
            f"workspace {where} (nor a checkpoint directory); `lightning-bridge checkpoint "
            "list` shows the checkpoints.",
            incomplete=f"searcher.source_checkpoint_uuid: checkpoint {uuid} is {{state}}, "
            "not complete; name another (lightning-bridge checkpoint list).",
        )
    trial_id = searcher.source_trial_id
    if trial_id is not None:
        newest = registry.latest_checkpoint(int(trial_id))
        if newest is None:
            raise InvalidArgumentError(
                f"searcher.source_trial_id: trial {trial_id} has no complete checkpoint in the "
                f"workspace {where}; name a checkpoint with searcher.source_checkpoint_uuid "
                "instead."
            )
        return Source(newest.uuid, checkpoint=newest)
    return None
