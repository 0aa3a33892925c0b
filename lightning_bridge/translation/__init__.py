"""The trial on Lightning: `Trainer.fit`'s loop on `lightning.Fabric`, and `TrialModule`.

Both drive one `TrialCore` (the trial contract and the fit's progress). `Trainer.fit` runs
`FitLoop`, which asks a pure `Schedule` what each batch reached, saves through one
`Checkpointer` and polls one `StopRequest`; the run record, a search's report, Lightning's
loggers and the progress bar observe the fit (`FitObserver`). `TrialModule` runs the core
inside a user's own `lightning.Trainer`. The public names are re-exported from
`lightning_bridge`.
"""
