"""`DeterminedCheckpoint`: a `TrialModule`'s checkpoints in Determined's layout, from a
`lightning.Trainer`.

Lightning's own `ModelCheckpoint` writes Lightning's `.ckpt` files (they carry the trial's
state too, for `Trainer.fit(ckpt_path=...)`). This callback writes what Determined writes: a
directory named by a uuid holding `state_dict.pth`, `metadata.json`, `load_data.json` and
`code/`, with the `latest` pointer, so that `load_trial_from_checkpoint_path`,
`lightning-bridge run --resume`, `lightning-bridge checkpoint`, `TrialModule(latest_checkpoint=
...)` and Determined itself (`pytorch.Trainer.fit(latest_checkpoint=...)`) read it. It saves
through the fit's `Checkpointer` (atomic, background writes, the chief writes) at Lightning's
checkpoint points: every N batches, every N epochs, after validations (Determined's
`checkpoint_policy`) and where training ends, which includes a stop request. Retention follows
Determined's `checkpoint_storage` (`save_trial_latest`, `save_trial_best`).
"""

from __future__ import annotations

import logging
import os
import pathlib
from typing import Any

import lightning.pytorch as pl

from lightning_bridge._errors import CheckpointWriteError, InvalidArgumentError
from lightning_bridge.checkpoint._retention import CheckpointRetention
from lightning_bridge.checkpoint._writable import check_writable
from lightning_bridge.contract._context import config_values
from lightning_bridge.translation.fit._checkpointer import CHECKPOINT_POLICIES, Checkpointer
from lightning_bridge.translation.fit._core import TrialCore
from lightning_bridge.translation.fit._init import checkpoint_dir, setup_of
from lightning_bridge.translation.fit._trial_module import TrialModule

logger = logging.getLogger("lightning_bridge")


def _at_least(low: int, name: str, value: int | None) -> int | None:
    """`value` when it is None or an int >= `low`; else one message naming the argument."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
        raise InvalidArgumentError(
            f"DeterminedCheckpoint({name}=...) must be an int >= {low} or None; got {value!r}."
        )
    return value


class DeterminedCheckpoint(pl.Callback):
    """Writes a `TrialModule`'s trial as Determined checkpoints (see the module docstring).

    `dirpath`: where (default: the context's checkpoint directory, as `Trainer.fit` uses).
    `every_n_train_steps` / `every_n_epochs`: a checkpoint every N trial batches / epochs
    (Determined's `checkpoint_period`). `save_on_train_end`: one where training ends (at its
    length, by `EarlyStopping`, or by a stop request), unless the last one is current.
    `checkpoint_policy`: after each validation, `"best"` (by `monitor`), `"all"` or `"none"`;
    by default `"best"` when a metric is known (`monitor`, else the config's
    `searcher.metric`), else `"all"`, as `fit()` does. `mode`: `"min"` or `"max"` (default:
    the config's `searcher.smaller_is_better`). `save_trial_latest` / `save_trial_best`: how
    many of the newest / best checkpoints to keep (default: the config's `checkpoint_storage`;
    everything without one). After the fit, `checkpoints` lists the directories kept.
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        *,
        every_n_train_steps: int | None = None,
        every_n_epochs: int | None = None,
        save_on_train_end: bool = True,
        checkpoint_policy: str | None = None,
        monitor: str | None = None,
        mode: str | None = None,
        save_trial_latest: int | None = None,
        save_trial_best: int | None = None,
    ) -> None:
        if checkpoint_policy is not None and checkpoint_policy not in CHECKPOINT_POLICIES:
            raise InvalidArgumentError(
                f"DeterminedCheckpoint(checkpoint_policy=...) must be one of "
                f"{', '.join(CHECKPOINT_POLICIES)}; got {checkpoint_policy!r}."
            )
        if mode not in (None, "min", "max"):
            raise InvalidArgumentError(
                f"DeterminedCheckpoint(mode=...) must be 'min' or 'max'; got {mode!r}."
            )
        self.dirpath = None if dirpath is None else pathlib.Path(dirpath).absolute()
        self.every_n_train_steps = _at_least(1, "every_n_train_steps", every_n_train_steps)
        self.every_n_epochs = _at_least(1, "every_n_epochs", every_n_epochs)
        self.save_on_train_end = bool(save_on_train_end)
        self.checkpoint_policy = checkpoint_policy
        self.monitor = monitor
        self.mode = mode
        self.save_trial_latest = _at_least(0, "save_trial_latest", save_trial_latest)
        self.save_trial_best = _at_least(0, "save_trial_best", save_trial_best)
        self._checkpointer: Checkpointer | None = None
        self._core: TrialCore | None = None
        self.checkpoints: list[pathlib.Path] = []

    @property
    def last_checkpoint(self) -> pathlib.Path | None:
        """The newest checkpoint written (None before one)."""
        return self.checkpoints[-1] if self.checkpoints else None

    # ----- the fit starts: the directory, the policy, retention -----

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not isinstance(pl_module, TrialModule):
            raise InvalidArgumentError(
                "DeterminedCheckpoint writes a TrialModule's trial as a Determined checkpoint; "
                f"the Trainer runs a {type(pl_module).__name__}. Use Lightning's ModelCheckpoint "
                "for other LightningModules."
            )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert isinstance(pl_module, TrialModule)
        core = pl_module.core
        ctx = core.context
        config = config_values(ctx)
        metric = self.monitor or config.searcher_metric
        policy = self.checkpoint_policy or ("best" if metric else "all")
        if policy == "best" and not metric:
            raise InvalidArgumentError(
                "DeterminedCheckpoint(checkpoint_policy='best') compares a validation metric: "
                "pass monitor='<metric name>' (or set searcher.metric in the config)."
            )
        smaller = config.smaller_is_better if self.mode is None else self.mode == "min"
        if self.save_trial_latest is None and self.save_trial_best is None:
            retention = CheckpointRetention.from_section(
                config.checkpoint_storage, smaller_is_better=smaller
            )
        else:
            retention = CheckpointRetention(
                keep_latest=1 if self.save_trial_latest is None else self.save_trial_latest,
                keep_best=1 if self.save_trial_best is None else self.save_trial_best,
                smaller_is_better=smaller,
            )
        directory = self.dirpath or checkpoint_dir(ctx, setup_of(ctx).checkpoint_dir)
        checkpointer = Checkpointer(
            directory,
            policy=policy,
            searcher_metric=metric,
            smaller_is_better=smaller,
            retention=retention,
            observer=core.observers,
        )

        def hold() -> None:
            # The chief checks and holds the directory; every process learns if it cannot.
            if core.is_chief:
                check_writable(directory)
            checkpointer.hold(core)

        self._agreed(trainer, hold, InvalidArgumentError)
        continued = pl_module.continued_from
        if continued is not None:
            checkpointer.continue_retention(*continued)
        self._checkpointer, self._core = checkpointer, core
        self.checkpoints = checkpointer.saved

    # ----- Lightning's checkpoint points -----

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        core, checkpointer = self._core, self._checkpointer
        if core is None or checkpointer is None:
            return
        state = core.state
        if checkpointer.busy:  # start the save queued before this batch with a snapshot
            checkpointer.advance(training_goes_on=True)
        n_batches, n_epochs = self.every_n_train_steps, self.every_n_epochs
        epoch_end = state.batches_trained % core.epoch_len == 0
        due = (n_batches is not None and state.batches_trained % n_batches == 0) or (
            n_epochs is not None and epoch_end and state.epochs_trained % n_epochs == 0
        )
        if due and not state.checkpoint_is_current:
            self._save(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        core, checkpointer = self._core, self._checkpointer
        if core is None or checkpointer is None or trainer.sanity_checking:
            return
        metrics = core.last_validation_metrics or {}
        if checkpointer.wants(core, metrics):
            self._save(trainer, metrics)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        core, checkpointer = self._core, self._checkpointer
        if core is None or checkpointer is None:
            return
        try:
            if self.save_on_train_end and not core.state.checkpoint_is_current:
                self._save(trainer)
            self._agreed(trainer, lambda: checkpointer.settle(core), CheckpointWriteError)
        except BaseException:
            self._release(failed=True)
            raise
        self._release(failed=False)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._release(failed=True)

    # ----- saving -----

    def _save(self, trainer: pl.Trainer, metrics: dict[str, Any] | None = None) -> None:
        """Checkpoint now (the chief writes, in the background); every process learns its
        id, or that it failed, and the trial's callbacks hear `on_checkpoint_upload_end`."""
        core, checkpointer = self._core, self._checkpointer
        assert core is not None and checkpointer is not None
        if core.window_open:  # as Determined: a boundary closes the training window first
            core.close_training_window()
        storage_id = self._agreed(
            trainer, lambda: checkpointer.save(core, metrics), CheckpointWriteError
        )
        if checkpointer.busy and not trainer.should_stop:
            checkpointer.advance(training_goes_on=True)
        for cb in core.trial_callbacks.values():
            cb.on_checkpoint_upload_end(uuid=storage_id)

    @staticmethod
    def _agreed(trainer: pl.Trainer, part: Any, error: type[Exception]) -> Any:
        """Run this process's `part`; every process learns whether the chief's failed (then
        all raise `error`) and gets the chief's result."""
        value: Any = None
        failure = None
        try:
            value = part()
        except error as exc:
            failure = str(exc)
        # Only the chief holds the directory and writes: its outcome is everyone's.
        failure = trainer.strategy.broadcast(failure, src=0)
        if failure:
            raise error(failure)
        return trainer.strategy.broadcast(value, src=0)

    def _release(self, failed: bool) -> None:
        checkpointer, self._checkpointer = self._checkpointer, None
        self._core = None
        if checkpointer is None:
            return
        checkpointer.close(failed=failed)
        self.checkpoints = list(checkpointer.saved)
