"""The trial on Lightning: a generated `LightningModule` plus Lightning callbacks.

`TrialModule` runs a trial inside Lightning's loops (manual optimization through the
strategy and precision plugin), `TrialBoundaries` adds Determined's schedule of validations,
checkpoints and reports, metrics are reduced and reported to Lightning's loggers, and
`init()` / `Trainer` build the `lightning.Trainer` for a fit. The public names are
re-exported from `lightning_bridge`.
"""
