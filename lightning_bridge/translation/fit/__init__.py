"""The fit: `Trainer.fit`'s loop on `lightning.Fabric` (`_fit_loop`, Determined's `_schedule`,
one `_checkpointer`, one `_stop_request`, the Fabric engine and its launch) and `TrialModule`
for a user's own `lightning.Trainer`, both driving one `TrialCore` (`_core`); the trial's
data and metric reports; `init()` and `Trainer`, which wire the fit to the services."""
