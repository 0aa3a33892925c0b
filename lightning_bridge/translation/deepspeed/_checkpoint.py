"""A `DeepSpeedTrial`'s checkpoint, in Determined's layout, written and read on every rank.

Each process writes `det_state_dict_rank{R}.pth` (the trial callbacks' states and the RNG
states, after `on_checkpoint_save_start`; the bridge's own entry holds the data position and,
on the chief, the retention record) and calls the trial's `save(context, path)`, by default
`engine.save_checkpoint(path, tag=f"model{i}")` for each wrapped engine (DeepSpeed's
collective: every rank writes its shard, and `latest`). The chief seals the checkpoint with
`trial_state.pkl`, `load_data.json` (`"trial_type": "DeepSpeedTrial"`) and the bridge's
metadata (`Checkpointer`). A continued run reads its rank's file safely (weights only), then
`on_checkpoint_load_start`, the trial's `load(context, path)`, the RNG and callback states.
"""

from __future__ import annotations

import pathlib
from typing import Any, Protocol

from lightning_bridge._secrets import redact_config
from lightning_bridge.checkpoint._layout import EXTRAS_KEY, save_state
from lightning_bridge.checkpoint._safe_load import load_state_file
from lightning_bridge.contract._deepspeed import DeepSpeedTrialContext
from lightning_bridge.translation.fit._payload import capture_rng_state, restore_rng_state


class DeepSpeedCore(Protocol):
    """What a checkpoint reads of the core driving the trial (`_core.DeepSpeedCore`)."""

    ds_context: DeepSpeedTrialContext
    trial_callbacks: dict[str, Any]

    @property
    def trial(self) -> Any: ...

    def data_state(self) -> dict[str, Any]: ...


TRUST_HINT = "deepspeed.Trainer.fit(..., trust_checkpoint=True)"


def part_name(rank: int) -> str:
    """The file of rank `rank`'s states, as Determined names it."""
    return f"det_state_dict_rank{rank}.pth"


def write_part(core: DeepSpeedCore, directory: pathlib.Path, entries: dict[str, Any]) -> None:
    """This rank's part of a checkpoint into `directory` (a collective: the engines' saves)."""
    ctx = core.ds_context
    checkpoint: dict[str, Any] = {
        "callbacks": {name: cb.state_dict() for name, cb in core.trial_callbacks.items()},
        "rng_state": capture_rng_state(),
    }
    for cb in core.trial_callbacks.values():
        cb.on_checkpoint_save_start(checkpoint)
    checkpoint[EXTRAS_KEY] = {"data": core.data_state(), **entries}
    with open(directory / part_name(ctx.distributed.rank), "wb") as f:
        save_state(checkpoint, f)
    core.trial.save(ctx, directory)


def load_data(core: DeepSpeedCore) -> dict[str, Any]:
    """`load_data.json` as Determined writes it for a DeepSpeedTrial (shared with the
    checkpoint: the config's secrets masked)."""
    ctx = core.ds_context
    cls = type(core.trial)
    config = ctx._exp_conf
    return {
        "trial_type": "DeepSpeedTrial",
        "experiment_config": redact_config(config) if config is not None else None,
        "hparams": ctx._hparams,
        "trial_cls_spec": f"{cls.__module__}:{cls.__qualname__}",
    }


def read_part(path: pathlib.Path, rank: int, *, trusted: bool = False) -> dict[str, Any]:
    """Rank `rank`'s states of the checkpoint `path`, loaded safely; the bridge's entry is
    returned under "data" / "retention" (empty for Determined's checkpoints)."""
    checkpoint = load_state_file(path, trusted=trusted, trust_hint=TRUST_HINT, name=part_name(rank))
    extras = checkpoint.pop(EXTRAS_KEY, None) or {}
    return {"checkpoint": checkpoint, **extras}


def apply_part(core: DeepSpeedCore, path: pathlib.Path, part: dict[str, Any]) -> None:
    """Restore the checkpoint `path` on this rank, in Determined's order."""
    checkpoint = part["checkpoint"]
    for cb in core.trial_callbacks.values():
        cb.on_checkpoint_load_start(checkpoint)
    core.trial.load(core.ds_context, path)
    if "rng_state" in checkpoint:
        restore_rng_state(checkpoint["rng_state"])
    saved = checkpoint.get("callbacks", {}) or {}
    for name, cb in core.trial_callbacks.items():
        if name in saved:
            cb.load_state_dict(saved[name])
