"""The experiment-level end of the mirror: after a run, and `lightning-bridge experiment sync`.

A trial's process mirrors its own run while it trains (`translation._mlflow_mirror`); what it
cannot know (a trial that failed or was killed, the search's parent run finishing) and what it
could not send (the server was away) is sent here, from the record, idempotently.
"""

from __future__ import annotations

import logging
import pathlib

from lightning_bridge.record._registry import Registry
from lightning_bridge.tracking._settings import tracking_uri, ui_line

logger = logging.getLogger("lightning_bridge")


def experiment_uri(registry: Registry, experiment_id: int, given: str | None = None) -> str | None:
    """The tracking URI of an experiment: `given`, else the one its run was given, else the
    workspace's (see `_settings`)."""
    recorded = registry.experiment(experiment_id).options.get("tracking_uri")
    return tracking_uri(registry.workspace.root, given or recorded)


def sync(registry: Registry, experiment_id: int, uri: str) -> str:
    """Send what MLflow lacks of the experiment; returns the MLflow experiment id (errors
    propagate: the `sync` command reports them)."""
    from lightning_bridge.tracking._mirror import Mirror, bounded_requests

    bounded_requests()
    return Mirror(registry, uri).sync_experiment(experiment_id)


def sync_after_run(registry: Registry, experiment_id: int) -> str | None:
    """At the end of a run: send what is missing, and the line that says where to look (a
    warning naming `experiment sync` when MLflow could not be reached); None: no mirror."""
    try:
        uri = experiment_uri(registry, experiment_id)
    except Exception as exc:  # noqa: BLE001 - the run itself succeeded
        logger.warning("No MLflow mirror: %s", exc)
        return None
    if uri is None:
        return None
    try:
        sync(registry, experiment_id, uri)
    except Exception as exc:  # noqa: BLE001 - the record keeps everything
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        logger.warning(
            "MLflow at %s did not take experiment %d (%s); send it later with "
            "`lightning-bridge experiment sync %d`",
            uri,
            experiment_id,
            first,
            experiment_id,
        )
        return None
    return ui_line(uri, pathlib.Path(registry.workspace.root))
