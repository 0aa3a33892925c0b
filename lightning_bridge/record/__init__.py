"""The experiment record: experiments, trials, metrics and checkpoints in a local registry.

A workspace folder holds the registry (SQLite through SQLAlchemy, safe for several writing
processes) and one folder per trial (its checkpoints, TensorBoard / CSV logs and log file). The
runner creates experiments and trials; a trial's own process records its metrics and
checkpoints; the `experiment`, `trial` and `checkpoint` commands read it. No torch, no
Lightning: reading the record is instant.
"""
