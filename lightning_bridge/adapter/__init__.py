"""The Lightning direction: a `LightningModule` (and data module) as a `PyTorchTrial`.

`lightning_trial()` / `LightningAdapter` use only the trial contract, so the same class trains
on `lightning_bridge.Trainer` and on Determined's own. The module sees a stand-in trainer,
`self.log` is routed into the trial's metrics and `configure_optimizers` is parsed by
Lightning's own helpers (imported in one place, `_lightning_private`).
"""
