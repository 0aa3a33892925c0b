"""`Mirror`: the workspace's record copied into MLflow, idempotently.

Every call sends what MLflow does not have yet, read from the record (the source of truth):

- one MLflow experiment per experiment, found again by its tag `lightning_bridge.key` (the
  record, i.e. the workspace or the record's server, and the experiment id: machines sharing a
  record on a server mirror into the same MLflow experiment), named `NAME [ID]`; the link is
  also written to the experiment's folder (`mlflow.json`), which `experiment describe` shows;
- a search's parent run (tag `lightning_bridge.role=search`), and one run per trial (tag
  `lightning_bridge.trial_id`) nested under it;
- params: the trial's flattened hyperparameters; tags: trial id, state, seed, searcher, the
  Slurm job id where there is one, and a searcher's stop (`lightning_bridge.searcher_stopped`:
  ASHA ended the trial before `max_length`);
- metrics: every training and validation report, at its batch, under the record's names (a
  validation metric named like a training one gets `validation_`), with the report's time as
  the timestamp; the run's tag `lightning_bridge.metrics_through` is the time of the last
  report sent, so a report is sent once;
- artifacts: the experiment config (`config.json`, its secrets masked) and, once the trial
  ended, its log (`trial.log`); each checkpoint as a reference (tag
  `lightning_bridge.checkpoint.<uuid>`) to its remote location, or, stored locally, logged
  once under `checkpoints/<uuid>`;
- the run's state: RUNNING, FINISHED (COMPLETED), KILLED (STOPPED), FAILED (ERROR).

Creation is serialized by a lock file in the experiment's folder, so the trials of a search
that mirror at once make one experiment and one parent run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import pathlib
from collections.abc import Iterator
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._private import write_file
from lightning_bridge._secrets import redact_config
from lightning_bridge.record._records import Experiment, Trial
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import CheckpointState, TrialState
from lightning_bridge.search._searchers import searcher_of
from lightning_bridge.search._space import flat
from lightning_bridge.tracking._settings import artifact_location, require_mlflow

logger = logging.getLogger("lightning_bridge")

TAG = "lightning_bridge."
LINK_FILE = "mlflow.json"
RUN_STATUS = {
    TrialState.ACTIVE.value: "RUNNING",
    TrialState.COMPLETED.value: "FINISHED",
    TrialState.STOPPED.value: "KILLED",
    TrialState.ERROR.value: "FAILED",
}
_POSITION = ("batches", "epochs")
_ASHA = ("adaptive_asha", "async_halving")
# MLflow's limits per log_batch call.
_BATCH_METRICS = 1000
_BATCH_PARAMS = 100
_SQLITE = "sqlite:///"


def bounded_requests(retries: int = 2, timeout_s: int = 5) -> None:
    """Let a request to an unreachable server fail in seconds, not minutes (MLflow's default
    is 7 retries with exponential backoff); values the user set are kept."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(retries))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(timeout_s))
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


_REFUSED_STATUS = (401, 403)
_CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def check_credentials(uri: str) -> None:
    """Refuse a tracking server that answers this process's credentials with 401 or 403
    (basic authentication, `mlflow server --app-name basic-auth`: `MLFLOW_TRACKING_USERNAME`
    and `MLFLOW_TRACKING_PASSWORD`, or MLflow's other ways): one line naming the server and
    the fix. A server that does not answer is no refusal (the record waits for it, `experiment
    sync`). MLflow's client sends the credentials from this process's environment, which the
    trial's processes inherit: they are in no argument list or file of the bridge's."""
    if not uri.startswith(("http://", "https://")):
        return
    bounded_requests()
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except MlflowException as exc:
        status = next((c for c in _REFUSED_STATUS if f"error code {c}" in str(exc)), None)
        if status is None and exc.get_http_status_code() in _REFUSED_STATUS:
            status = exc.get_http_status_code()
        if status is None:
            return
        given = [name for name in _CREDENTIALS if os.environ.get(name)]
        sent = "the user in MLFLOW_TRACKING_USERNAME" if given else "no credentials"
        raise InvalidArgumentError(
            f"MLflow at {uri} refused this command's credentials (HTTP {status}; it sent "
            f"{sent}); set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to a user of "
            "the server with access to its experiments, or --tracking-uri off to run without "
            "the mirror"
        ) from None
    except Exception:  # noqa: BLE001 - no answer: the mirror catches up later
        return


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _remote(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def searcher_stopped(experiment: Experiment, trial: Trial) -> bool:
    """An ASHA search ended this trial before its longest training (`max_time` in
    `time_metric`, else `max_length`): it completed early."""
    searcher = searcher_of(experiment.config)
    length = searcher.length() if searcher is not None else None
    if searcher is None or searcher.name not in _ASHA or length is None:
        return False
    if trial.state != TrialState.COMPLETED.value or trial.message.startswith("InvalidHP"):
        return False
    unit, value = length
    if unit == "epochs":
        return trial.epochs_trained < value
    if unit == "records":
        per_batch = int(trial.hparams.get("global_batch_size") or 1)
        return trial.batches_trained * per_batch < value
    return trial.batches_trained < value


def open_client(uri: str) -> Any:
    """MLflow's client of `uri`. A new SQLite store is created whole or not at all: MLflow
    creates and migrates a store's tables on first use (dozens of steps, tens of seconds on a
    loaded machine), and a process ending half-way (a trial's end, a kill) would leave a file
    no later run can open. It is built under another name, under a lock beside the file (the
    trials of a search that start together wait for the first), then renamed into place."""
    from mlflow import MlflowClient

    if not uri.startswith(_SQLITE):
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    path = pathlib.Path(uri[len(_SQLITE) :])
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            building = path.with_name(f".{path.name}.new")
            building.unlink(missing_ok=True)  # left by a creator that did not finish
            new = f"{_SQLITE}{building}"
            MlflowClient(tracking_uri=new, registry_uri=new).search_experiments(max_results=1)
            os.replace(building, path)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


class Mirror:
    """Sends one workspace's record to the MLflow tracking server at `uri`."""

    def __init__(self, registry: Registry, uri: str) -> None:
        require_mlflow("Mirroring the record into MLflow")
        self.registry = registry
        self.uri = uri
        self.workspace = registry.workspace.root
        self.client = open_client(uri)

    # ----- the link on the bridge's side -----

    def _link_path(self, experiment_id: int) -> pathlib.Path:
        return self.registry.workspace.experiment_dir(experiment_id) / LINK_FILE

    @contextlib.contextmanager
    def _lock(self, experiment_id: int) -> Iterator[None]:
        folder = self.registry.workspace.experiment_dir(experiment_id)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".mlflow.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _write_link(self, bridge_id: int, **values: Any) -> None:
        path = self._link_path(bridge_id)
        data = read_link(path.parent)
        if data.get("tracking_uri") != self.uri:
            data = {"tracking_uri": self.uri}
        merged = {**data, **values, "runs": {**data.get("runs", {}), **values.get("runs", {})}}
        if merged == data:
            return
        write_file(path, json.dumps(merged, indent=1))  # its URI may hold a password

    # ----- experiments and runs -----

    def experiment_key(self, experiment_id: int) -> str:
        """What finds an experiment's MLflow experiment again: its record and id. Machines
        that share a record on a server (a search's workers) share its experiments, so they
        find the same one; a workspace's own SQLite record is named by the workspace."""
        where = self.registry.location if self.registry.url else str(self.workspace)
        return f"{where}#{experiment_id}"

    def mlflow_experiment(self, experiment: Experiment) -> str:
        """The MLflow experiment of `experiment` (created the first time)."""
        from mlflow.entities import ViewType
        from mlflow.exceptions import MlflowException

        key = self.experiment_key(experiment.id)

        def find() -> list[Any]:
            return list(
                self.client.search_experiments(
                    view_type=ViewType.ALL, filter_string=f"tags.`{TAG}key` = {_quoted(key)}"
                )
            )

        found = find()
        if found:
            mlflow_id = str(found[0].experiment_id)
            if found[0].lifecycle_stage == "deleted":
                self.client.restore_experiment(mlflow_id)
        else:
            tags = {
                f"{TAG}key": key,
                f"{TAG}experiment_id": str(experiment.id),
                f"{TAG}workspace": str(self.workspace),
                f"{TAG}config_path": experiment.config_path,
                "mlflow.note.content": experiment.description
                or f"lightning-bridge experiment {experiment.id} of {self.workspace}",
            }
            name = f"{experiment.name or 'experiment'} [{experiment.id}]"
            location = artifact_location(self.uri, self.workspace, experiment.id)
            try:
                mlflow_id = self.client.create_experiment(name, location, tags)
            except MlflowException as exc:  # another machine's, or another workspace's
                if "already exists" not in str(exc).lower():
                    raise
                found = find()  # a machine sharing the record made it just now
                if found:
                    mlflow_id = str(found[0].experiment_id)
                else:
                    name = f"{name} ({self.workspace})"
                    mlflow_id = self.client.create_experiment(name, location, tags)
        self._write_link(
            experiment.id,
            mlflow_experiment_id=str(mlflow_id),
            experiment_name=self._name(mlflow_id),
        )
        return str(mlflow_id)

    def _name(self, mlflow_id: str) -> str:
        return str(self.client.get_experiment(mlflow_id).name)

    def _find_run(self, mlflow_id: str, tag: str, value: str) -> Any:
        from mlflow.entities import ViewType

        runs = self.client.search_runs(
            [mlflow_id],
            filter_string=f"tags.`{TAG}{tag}` = {_quoted(value)}",
            run_view_type=ViewType.ALL,
            max_results=1,
        )
        return runs[0] if runs else None

    def _search_run(self, mlflow_id: str, experiment: Experiment) -> Any:
        """A search's parent run (None for an experiment of one trial)."""
        search = experiment.options.get("search")
        if not search:
            return None
        run = self._find_run(mlflow_id, "role", "search")
        if run is None:
            searcher = searcher_of(experiment.config)
            run = self.client.create_run(
                mlflow_id,
                start_time=int(experiment.created_at * 1000),
                tags={
                    f"{TAG}role": "search",
                    f"{TAG}experiment_id": str(experiment.id),
                    f"{TAG}searcher": searcher.name if searcher is not None else "",
                    f"{TAG}searcher_metric": str(experiment.searcher_metric or ""),
                    f"{TAG}search_name": str(search.get("name", "")),
                },
                run_name=f"search {search.get('name') or experiment.id}",
            )
            # The section as written (the model would add its defaults and retype values).
            section = experiment.config["searcher"] if searcher is not None else {}
            searcher_params = {f"searcher.{k}": v for k, v in flat(section).items()}
            self._log_params(run.info.run_id, searcher_params, {})
        return run

    def _trial_run(self, mlflow_id: str, trial: Trial, parent: Any) -> Any:
        run = self._find_run(mlflow_id, "trial_id", str(trial.id))
        if run is None:
            tags = {f"{TAG}trial_id": str(trial.id)}
            if parent is not None:
                tags["mlflow.parentRunId"] = parent.info.run_id
            run = self.client.create_run(
                mlflow_id,
                start_time=int((trial.start_time or self._created(trial)) * 1000),
                tags=tags,
                run_name=f"trial {trial.id}",
            )
        return run

    def _created(self, trial: Trial) -> float:
        return self.registry.experiment(trial.experiment_id).created_at

    # ----- sending -----

    def sync_experiment(self, experiment_id: int, extra_tags: dict[str, str] | None = None) -> str:
        """Send everything of the experiment MLflow lacks; returns the MLflow experiment id."""
        experiment = self.registry.experiment(experiment_id)
        with self._lock(experiment_id):
            mlflow_id = self.mlflow_experiment(experiment)
            parent = self._search_run(mlflow_id, experiment)
            trials = self.registry.trials(experiment_id)
            runs = {t.id: self._trial_run(mlflow_id, t, parent) for t in trials}
        for trial in trials:
            self._sync_trial(experiment, trial, runs[trial.id], extra_tags)
        if parent is not None:
            from lightning_bridge.record._registry import experiment_state

            self._set_status(parent, experiment_state(self.registry.trials(experiment_id)))
        return mlflow_id

    def sync_trial(self, trial_id: int, extra_tags: dict[str, str] | None = None) -> str:
        """Send everything of one trial MLflow lacks; returns its run id."""
        trial = self.registry.trial(trial_id)
        experiment = self.registry.experiment(trial.experiment_id)
        with self._lock(experiment.id):
            mlflow_id = self.mlflow_experiment(experiment)
            parent = self._search_run(mlflow_id, experiment)
            run = self._trial_run(mlflow_id, trial, parent)
        self._sync_trial(experiment, trial, run, extra_tags)
        return str(run.info.run_id)

    def _sync_trial(
        self, experiment: Experiment, trial: Trial, run: Any, extra_tags: dict[str, str] | None
    ) -> None:
        run_id = run.info.run_id
        have_tags: dict[str, str] = dict(run.data.tags)
        self._log_params(run_id, flat(trial.hparams), dict(run.data.params))
        self._log_metrics(run_id, trial, have_tags)
        searcher = searcher_of(experiment.config)
        tags = {
            f"{TAG}trial_id": str(trial.id),
            f"{TAG}experiment_id": str(experiment.id),
            f"{TAG}state": trial.state,
            f"{TAG}seed": "" if trial.seed is None else str(trial.seed),
            f"{TAG}searcher": searcher.name if searcher is not None else "",
            f"{TAG}batches_trained": str(trial.batches_trained),
            **(extra_tags or {}),
        }
        if trial.message:
            tags[f"{TAG}message"] = trial.message[:4000]
        if searcher_stopped(experiment, trial):
            tags[f"{TAG}searcher_stopped"] = f"true (at batch {trial.batches_trained})"
        if f"{TAG}config" not in have_tags:
            self.client.log_dict(run_id, redact_config(experiment.config), "config.json")
            tags[f"{TAG}config"] = "config.json"
        final = trial.state != TrialState.ACTIVE.value
        log = pathlib.Path(trial.log_file) if trial.log_file else None
        if final and log is not None and log.is_file():
            size = str(log.stat().st_size)
            if have_tags.get(f"{TAG}log") != size:
                self.client.log_artifact(run_id, str(log))
                tags[f"{TAG}log"] = size
        tags.update(self._checkpoints(run_id, trial, have_tags))
        changed = {k: v for k, v in tags.items() if have_tags.get(k) != v}
        self._set_tags(run_id, changed)
        self._set_status(run, trial.state, trial.end_time)
        self._write_link(experiment.id, runs={str(trial.id): run_id})

    def _log_params(self, run_id: str, params: dict[str, Any], have: dict[str, str]) -> None:
        from mlflow.entities import Param

        missing = [
            Param(str(k)[:250], str(v)[:6000])
            for k, v in params.items()
            if str(k)[:250] not in have
        ]
        for start in range(0, len(missing), _BATCH_PARAMS):
            self.client.log_batch(run_id, params=missing[start : start + _BATCH_PARAMS])

    def _log_metrics(self, run_id: str, trial: Trial, have_tags: dict[str, str]) -> None:
        from mlflow.entities import Metric

        through = float(have_tags.get(f"{TAG}metrics_through", "-inf"))
        reports = self.registry.metrics(trial.id, archived=True)
        training_names = {k for m in reports if m.kind == "training" for k in m.values}
        pending = sorted(
            (m for m in reports if m.reported_at > through), key=lambda m: m.reported_at
        )
        if not pending:
            return
        metrics = []
        for report in pending:
            stamp = int(report.reported_at * 1000)
            for key, value in report.values.items():
                number = _number(value)
                if number is None or (report.kind == "validation" and key in _POSITION):
                    continue
                name = key
                if report.kind == "validation" and key in training_names:
                    name = f"validation_{key}"
                metrics.append(Metric(name, number, stamp, report.batches))
        for start in range(0, len(metrics), _BATCH_METRICS):
            self.client.log_batch(run_id, metrics=metrics[start : start + _BATCH_METRICS])
        last = max(m.reported_at for m in pending)
        self.client.set_tag(run_id, f"{TAG}metrics_through", repr(last))

    def _checkpoints(self, run_id: str, trial: Trial, have_tags: dict[str, str]) -> dict[str, str]:
        """Reference or upload each completed checkpoint once; the tags that record it."""
        tags: dict[str, str] = {}
        for checkpoint in self.registry.checkpoints(
            trial_id=trial.id, states=(CheckpointState.COMPLETED,)
        ):
            tag = f"{TAG}checkpoint.{checkpoint.uuid}"
            if tag in have_tags:
                continue
            location = checkpoint.location
            if _remote(location):
                tags[tag] = location
                continue
            folder = pathlib.Path(location.removeprefix("file://"))
            if not folder.is_dir():
                continue
            self.client.log_artifacts(run_id, str(folder), f"checkpoints/{checkpoint.uuid}")
            self.client.set_tag(run_id, tag, f"runs:/{run_id}/checkpoints/{checkpoint.uuid}")
        return tags

    def _set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, v) for k, v in tags.items()]
        for start in range(0, len(items), _BATCH_PARAMS):
            self.client.log_batch(run_id, tags=items[start : start + _BATCH_PARAMS])

    def _set_status(self, run: Any, state: str, end_time: float | None = None) -> None:
        status = RUN_STATUS.get(state, "RUNNING")
        if run.info.status == status:
            return
        if status == "RUNNING":
            self.client.update_run(run.info.run_id, status="RUNNING")
        else:
            ended = int(end_time * 1000) if end_time and math.isfinite(end_time) else None
            self.client.set_terminated(run.info.run_id, status, ended)


def read_link(experiment_dir: pathlib.Path) -> dict[str, Any]:
    """The MLflow link the mirror wrote in an experiment's folder ({} when none)."""
    try:
        data = json.loads((experiment_dir / LINK_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
