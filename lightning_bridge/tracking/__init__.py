"""The experiment record mirrored into MLflow: a team's web UI and model registry.

`lightning-bridge` keeps its own record (the workspace's registry); this package copies it into
an MLflow tracking server (or, with none configured, MLflow's own SQLite store in the
workspace): one MLflow experiment per experiment, one run per trial (under a parent run for a
search), and MLflow's model registry behind `lightning-bridge model`. The record stays the
source of truth, so a mirror that could not reach MLflow sends what is missing later
(`lightning-bridge experiment sync ID`). MLflow is the `[mlflow]` extra; nothing here imports it
until a mirror or a model command runs.
"""
