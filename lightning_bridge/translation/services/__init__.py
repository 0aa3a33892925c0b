"""The trial's side of the services, as Determined keeps `core/` beside `pytorch/`: the run
description a trial's process is started with, the cluster info it answers
(`det.get_cluster_info()`), the trial's environment from whoever started it, and what the fit
reports to: the experiment record, a search's storage and the MLflow mirror."""
