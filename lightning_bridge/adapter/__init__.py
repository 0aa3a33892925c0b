"""The Lightning direction: a `LightningModule` (and data module) as a `PyTorchTrial`.

`lightning_trial()` / `LightningAdapter` (`_lightning_trial`) use only the trial contract, so
the same class trains on `lightning_bridge.Trainer` and on Determined's own. Each trial's fit is
one `LightningRun` (`_run`): the module sees a stand-in trainer, `self.log` is routed into the
trial's metrics and `configure_optimizers` is parsed by Lightning's own helpers (imported with
every other private Lightning name in `translation._lightning_private`).
"""
