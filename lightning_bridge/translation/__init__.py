"""The trial on Lightning, in two rooms: `fit/` (`Trainer.fit`'s loop on `lightning.Fabric`,
and `TrialModule` for a user's own `lightning.Trainer`, both driving one `TrialCore`) and
`services/` (the trial's side of the run description, cluster info, trial environment, run
record, search reports and MLflow mirror). The fit uses the services; the services never
import the fit. At this root is what both rooms speak: the fit's observer protocol
(`FitObserver`, which the record, a search's report and the MLflow mirror implement), metric
reduction, the engine settings a run description carries, and Lightning's private names. The
public names are re-exported from `lightning_bridge`.
"""
