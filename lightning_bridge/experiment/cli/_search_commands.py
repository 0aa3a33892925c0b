"""A hyperparameter search as an experiment: `run` starts one, `search-worker` joins one,
`experiment continue` resumes one.

Each search is an experiment of the workspace whose trials are the configurations the
searcher samples. Its state (trials, rungs, decisions) lives in an Optuna storage: a journal
file in the experiment's folder by default, or the `--storage` given (an SQLite file, a
PostgreSQL server that workers on other machines reach). The search keeps what a worker needs
beside it (the experiment config, the code's folder, the run's options), so
`lightning-bridge search-worker NAME --storage URL` on another machine records the trials it
takes in its own workspace, as an experiment of its own.
"""

from __future__ import annotations

import argparse
import logging
import math
import pathlib
import re
import secrets
import sys
from typing import Any

from lightning_bridge._errors import BridgeError, InvalidArgumentError
from lightning_bridge._secrets import redact_url
from lightning_bridge.experiment.cli._summary import checkpoint_line, format_value, table
from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.config._config import ResolvedConfig, parse_config
from lightning_bridge.experiment.launch._preflight import preflight
from lightning_bridge.experiment.searches._search_to_serve import (
    SearchToServe,
    launched_by,
    search_storage_url,
)
from lightning_bridge.experiment.searches._slurm_workers import WorkerJobs
from lightning_bridge.experiment.searches._worker import (
    SearchStorageUnavailable,
    SearchWorker,
)
from lightning_bridge.experiment.trial_process._exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from lightning_bridge.experiment.trials._checkpoints import Source
from lightning_bridge.experiment.trials._experiments import (
    continue_command,
    options_record,
)
from lightning_bridge.experiment.trials._source_checkpoint import warm_start_source
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.record._workspace import Workspace
from lightning_bridge.search import SearchDriver
from lightning_bridge.search._space import flat
from lightning_bridge.search._storage import import_optuna
from lightning_bridge.search._storage_check import check_search_storage

logger = logging.getLogger("lightning_bridge")

_EXPERIMENT_NOTE = "experiment"  # what the search keeps for its workers


def _error(problem: object) -> int:
    print(f"lightning-bridge: error: {problem}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def shown_storage(url: str) -> str:
    """A storage URL as printed: a password hidden (`_secrets.redact_url`)."""
    return redact_url(url)


def _absolute(storage: str) -> str:
    return storage if "://" in storage else str(pathlib.Path(storage).expanduser().resolve())


def _search_name(config: ResolvedConfig) -> str:
    """A name unique in any storage: the experiment's name and a random suffix."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", config.name or "search").strip("-")
    return f"{name[:40] or 'search'}-{secrets.token_hex(3)}"


def _source(registry: Registry, config: ResolvedConfig) -> Any:
    return warm_start_source(registry, config.model.searcher)


# ----- run -----


def run_search(
    args: argparse.Namespace,
    options: _plan.Options,
    config: ResolvedConfig,
    seed_line: str | None = None,
) -> int | None:
    """`lightning-bridge run CONFIG` (its `config`, loaded with `options.overrides`) when the
    config's searcher runs several trials (None for a config of one trial, which the ordinary
    run trains); `seed_line`, printed once the checks pass, says which experiment seed was
    drawn."""
    try:
        if not config.is_search:
            if args.storage:
                raise InvalidArgumentError(
                    "--storage keeps the state of a hyperparameter search, and this config's "
                    "searcher is single (one trial); leave --storage out"
                )
            return None
        if options.resume is not None:
            raise InvalidArgumentError(
                "--resume continues one trial; a search is continued with `lightning-bridge "
                "experiment continue ID`, and searcher.source_trial_id / "
                "source_checkpoint_uuid start each of its trials from a checkpoint"
            )
        config_file = pathlib.Path(args.config).resolve()
        folder = pathlib.Path(args.context_dir or config_file.parent).resolve()
        first = _plan.prepare_config(config.first_configuration(), folder, options)
        storage = _absolute(args.storage) if args.storage else None
        launcher = preflight(
            first,
            Workspace(args.workspace),
            new=True,
            search=True,
            search_storage=storage,
            written=[pathlib.Path(storage)] if storage else [],
        )
        warning = _plan.unused_warning(first, launcher.config_keys)
    except BridgeError as exc:
        return _error(exc)
    if seed_line:
        print(seed_line, flush=True)
    if warning:
        logger.warning(warning)
    name = _search_name(config)
    with Registry(args.workspace) as registry:
        try:
            source = _source(registry, config)
            experiment_id = registry.create_experiment(
                first.experiment_config(),
                name=config.name,
                description=config.description,
                config_path=str(config_file),
                context_dir=str(folder),
                options={**options_record(options), "search": {"storage": storage, "name": name}},
                searcher_metric=config.model.searcher.metric,
                smaller_is_better=config.model.searcher.smaller_is_better,
            )
            url = storage or search_storage_url(registry, experiment_id, {})
            driver = SearchDriver(url, name, config.search)
        except BridgeError as exc:
            return _error(exc)
        try:
            driver.set_search_note(
                _EXPERIMENT_NOTE,
                {
                    "config": config.raw,
                    "config_path": str(config_file),
                    "context_dir": str(folder),
                    "options": options_record(options),
                    "source_dir": _source_dir(registry, source),
                },
            )
            print(
                f"Experiment {experiment_id}: {config.model.searcher.name} search {name} "
                f"(storage {shown_storage(url)})",
                flush=True,
            )
            if storage is not None:
                print(
                    "Other machines serve it with: lightning-bridge search-worker "
                    f"{name} --storage {shown_storage(url)}",
                    flush=True,
                )
            return _serve(
                registry,
                driver,
                SearchToServe(
                    experiment_id, config, folder, options, url, source, float(args.lost_after)
                ),
            )
        finally:
            driver.close()


def _source_dir(registry: Registry, source: Source | None) -> str | None:
    """Where a worker on this machine finds the warm start's checkpoint without this
    workspace's record (a local directory), if it is one."""
    if source is None:
        return None
    if source.directory is not None:
        return str(source.directory)
    if source.checkpoint is not None and "://" not in source.checkpoint.location:
        return source.checkpoint.location
    return None


def _serve(registry: Registry, driver: SearchDriver, search: SearchToServe) -> int:
    """Serve `search` to its end or a stop (its worker jobs' when the launcher took them, else
    this machine's worker); print its summary; the command's exit code."""
    worker: SearchWorker | WorkerJobs
    if search.options.worker_jobs:  # the launcher took them (`preflight`): its worker jobs
        worker = WorkerJobs(registry, driver, search, say=lambda line: print(line, flush=True))
    else:
        worker = SearchWorker(registry, driver, search)
    try:
        finished = worker.serve()
    except SearchStorageUnavailable as exc:
        print(f"lightning-bridge: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    experiment_id = search.experiment_id
    print(search_summary(registry, worker.driver, experiment_id), flush=True)
    from lightning_bridge.tracking._sync import sync_after_run

    mirrored = sync_after_run(registry, experiment_id)
    if mirrored:
        print(mirrored, flush=True)
    if not finished:
        print(
            "The search stopped; its trials are checkpointed. Continue with: "
            f"{continue_command(registry.workspace, experiment_id)}",
            flush=True,
        )
        return EXIT_OK
    trials = registry.trials(experiment_id)
    if not trials and search.config.starts_no_trial:
        return EXIT_OK  # an empty grid: completed without a trial, as on Determined
    return EXIT_OK if any(t.state == TrialState.COMPLETED.value for t in trials) else EXIT_FAILED


# ----- search-worker and experiment continue -----


def search_worker(args: argparse.Namespace) -> int:
    """`lightning-bridge search-worker NAME --storage URL`: serve a search started elsewhere,
    recording its trials in this workspace."""
    try:
        import_optuna()
        storage = _absolute(args.storage)
        check_search_storage(storage, args.experiment)  # joins a search; never creates one
        driver = SearchDriver(storage, args.experiment)
    except BridgeError as exc:
        return _error(exc)
    try:
        info = driver.search_note(_EXPERIMENT_NOTE)
        if not info:
            return _error(
                InvalidArgumentError(
                    f"the search {args.experiment!r} was not started by `lightning-bridge run`; "
                    "it holds no experiment to run"
                )
            )
        folder = pathlib.Path(args.context_dir or info["context_dir"]).expanduser().resolve()
        try:
            config = parse_config(info["config"])
            options = launched_by(info["options"], args.launcher)
            first = _plan.prepare_config(config.first_configuration(), folder, options)
        except BridgeError as exc:
            return _error(
                f"{exc} (the search's code folder is {folder}; give --context-dir "
                "where this machine has it)"
            )
        try:  # before anything is recorded in this workspace
            preflight(first, Workspace(args.workspace))
        except BridgeError as exc:
            return _error(exc)
        with Registry(args.workspace) as registry:
            search = {"storage": storage, "name": args.experiment}
            found = [e.id for e in registry.experiments() if e.options.get("search") == search]
            if found:
                experiment_id = found[-1]
            else:
                experiment_id = registry.create_experiment(
                    first.experiment_config(),
                    name=config.name,
                    config_path=str(info.get("config_path") or ""),
                    context_dir=str(folder),
                    options={**info["options"], "launcher": options.launcher, "search": search},
                    searcher_metric=config.model.searcher.metric,
                    smaller_is_better=config.model.searcher.smaller_is_better,
                )
            try:
                source = _worker_source(registry, config, folder, info)
            except BridgeError as exc:
                return _error(exc)
            print(
                f"Experiment {experiment_id}: serving search {args.experiment} "
                f"(storage {shown_storage(storage)})",
                flush=True,
            )
            return _serve(
                registry,
                driver,
                SearchToServe(
                    experiment_id, config, folder, options, storage, source, float(args.lost_after)
                ),
            )
    finally:
        driver.close()


def _worker_source(
    registry: Registry, config: ResolvedConfig, folder: pathlib.Path, info: dict[str, Any]
) -> Source | None:
    """The warm start's checkpoint for a worker: from its own record, else the directory the
    search names (reachable from this machine)."""
    try:
        return _source(registry, config)
    except InvalidArgumentError:
        where = info.get("source_dir")
        if where and pathlib.Path(where).is_dir():
            return Source(where, directory=pathlib.Path(where))
        raise


def continue_search(
    registry: Registry,
    experiment_id: int,
    lost_after_s: float,
    launcher: str | None = None,
    worker_jobs: int | None = None,
) -> int:
    """`experiment continue ID` for a search: serve it again from where it stopped (pending
    trials, rungs; trials given back continue from their checkpoints), through its own
    launcher or `launcher` (`--launcher`), in its worker jobs or `worker_jobs`."""
    registry.reconcile()
    experiment = registry.experiment(experiment_id)
    search = experiment.options["search"]
    import_optuna()
    storage = search_storage_url(registry, experiment_id, search)
    driver = SearchDriver(storage, str(search["name"]))
    try:
        if driver.is_finished():
            print(
                f"Experiment {experiment_id} is complete: its search finished; nothing to continue."
            )
            return EXIT_OK
        config = parse_config(experiment.config)
        folder = pathlib.Path(experiment.context_dir)
        options = launched_by(experiment.options, launcher, worker_jobs)
        first = _plan.prepare_config(config.first_configuration(), folder, options)
        preflight(first, registry.workspace, search=True)
        source = _source(registry, config)
        print(f"Experiment {experiment_id}: continuing search {search['name']}", flush=True)
        return _serve(
            registry,
            driver,
            SearchToServe(experiment_id, config, folder, options, storage, source, lost_after_s),
        )
    finally:
        driver.close()


# ----- what it prints at the end -----


def search_summary(registry: Registry, driver: SearchDriver, experiment_id: int) -> str:
    """The search's trials recorded in this workspace (state, training, searcher metric,
    hyperparameters) and the best checkpoint."""
    experiment = registry.experiment(experiment_id)
    metric = experiment.searcher_metric
    views = {v.number: v for v in driver.trials()}
    finished = not any(v.state in ("waiting", "running") for v in views.values())
    rows = []
    for trial in registry.trials(experiment_id):
        values = [
            m.values[metric]
            for m in registry.metrics(trial.id, "validation")
            if metric and isinstance(m.values.get(metric), (int, float))
        ]
        last = values[-1] if values and math.isfinite(float(values[-1])) else None
        rows.append(
            (
                trial.id,
                trial.state,
                trial.batches_trained,
                "-" if last is None else format_value(last),
                ", ".join(f"{k}={_short(v)}" for k, v in sorted(flat(trial.hparams).items())),
            )
        )
    counted = len(views)
    lines = [
        f"Search {driver.name}: {'finished' if finished else 'not finished'}, {counted} trials "
        f"in all ({sum(v.state == 'invalid_hp' for v in views.values())} InvalidHP)",
        table(("Trial", "State", "Batches", metric or "metric", "Hyperparameters"), rows),
    ]
    best = registry.best_checkpoints(experiment_id, 1)
    if best:
        lines.append(
            f"Best checkpoint: trial {best[0].trial_id}, {checkpoint_line(best[0], metric)}"
        )
        lines.append(
            f"Best checkpoints: lightning-bridge checkpoint list --best --experiment "
            f"{experiment_id}"
        )
    return "\n".join(lines)


def _short(value: Any) -> str:
    return format_value(value) if isinstance(value, float) else str(value)
