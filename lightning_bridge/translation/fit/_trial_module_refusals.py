"""What a `TrialModule` cannot do under a `lightning.Trainer`, refused with one message each.

Checked from `TrialModule.configure_callbacks`, which Lightning calls before it sets anything
up for `fit`, `validate`, `test` and `predict` alike.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

TEST_REFUSAL = (
    "Trainer.test(module): a PyTorchTrial has no test step or test data. Run its "
    "evaluate_batch on other data with trainer.validate(module, dataloaders=test_loader), or "
    "on its validation data with trainer.validate(module)."
)
PREDICT_REFUSAL = (
    "Trainer.predict(module): a PyTorchTrial defines no prediction step. Call the trial's "
    "models yourself (module.trial, or load_trial_from_checkpoint_path(...) for a "
    "checkpoint), or put them in a LightningModule of your own with predict_step()."
)
SWA_REFUSAL = (
    "StochasticWeightAveraging does not work with a TrialModule: the trial steps its own "
    "optimizers (manual optimization), and Lightning steps the SWALR schedule the callback "
    "installs only under automatic optimization, so the SWA learning rates would never apply. "
    "Average the weights in the trial instead (torch.optim.swa_utils.AveragedModel and SWALR, "
    "wrapped with context.wrap_lr_scheduler)."
)


def refusal(trainer: Any, module: pl.LightningModule) -> str | None:
    """The message refusing what `trainer` is about to run `module` with, or None."""
    fn = trainer.state.fn
    if fn == "test":
        return TEST_REFUSAL
    if fn == "predict":
        return PREDICT_REFUSAL
    if any(isinstance(cb, pl.callbacks.StochasticWeightAveraging) for cb in trainer.callbacks):
        return SWA_REFUSAL
    return None
