"""The record's commands, in Determined's habits: `experiment list | describe | continue |
pause | kill | plot`, `trial logs`, `checkpoint list | download`.

Each reads the workspace's registry (`--workspace`, default the user's data directory) and
prints a table, or JSON with `--json` for scripts. None of them imports torch or Lightning,
except `experiment continue`, which trains (a search's continue is `_search_commands`').
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
from typing import TYPE_CHECKING, Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._secrets import redact_config
from lightning_bridge.experiment.cli._summary import (
    checkpoint_line,
    format_time,
    format_value,
    run_summary,
    table,
)
from lightning_bridge.experiment.config._config import parse_config
from lightning_bridge.record._records import Checkpoint, Experiment, Trial, as_dict
from lightning_bridge.record._registry import Registry, experiment_state
from lightning_bridge.tracking._mirror import read_link

if TYPE_CHECKING:
    from lightning_bridge.experiment.config._plan import Plan


def open_registry(args: argparse.Namespace) -> Registry:
    return Registry(args.workspace)


def _state(experiment: Experiment, trials: list[Trial]) -> str:
    """The experiment's state; with no trial, COMPLETED where its config starts none."""
    if trials:
        return experiment_state(trials)
    try:
        empty = parse_config(experiment.config).starts_no_trial
    except InvalidArgumentError:
        empty = False
    return experiment_state(trials, starts_no_trial=empty)


def _best_value(registry: Registry, experiment: Experiment) -> Any:
    metric = experiment.searcher_metric
    if metric is None:
        return None
    values = [
        m.values[metric]
        for t in registry.trials(experiment.id)
        for m in registry.metrics(t.id, "validation")
        if isinstance(m.values.get(metric), (int, float))
    ]
    if not values:
        return None
    return min(values) if experiment.smaller_is_better else max(values)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def experiment_list(args: argparse.Namespace) -> int:
    with open_registry(args) as registry:
        registry.reconcile()
        rows = []
        for exp in registry.experiments():
            trials = registry.trials(exp.id)
            rows.append(
                {
                    "id": exp.id,
                    "name": exp.name,
                    "state": _state(exp, trials),
                    "trials": len(trials),
                    "searcher_metric": exp.searcher_metric,
                    "best_validation": _best_value(registry, exp),
                    "created_at": exp.created_at,
                    "config_path": exp.config_path,
                }
            )
    if args.json:
        _print_json(rows)
        return 0
    if not rows:
        print(f"No experiments in the workspace {registry.workspace.root}.")
        return 0
    print(
        table(
            ("ID", "Name", "State", "Trials", "Best validation", "Created", "Config"),
            [
                (
                    r["id"],
                    r["name"],
                    r["state"],
                    r["trials"],
                    "-"
                    if r["best_validation"] is None
                    else f"{r['searcher_metric']} {format_value(r['best_validation'])}",
                    format_time(r["created_at"]),
                    r["config_path"],
                )
                for r in rows
            ],
        )
    )
    return 0


def experiment_describe(args: argparse.Namespace) -> int:
    from lightning_bridge.experiment.launch._registry import running_trial

    with open_registry(args) as registry:
        registry.reconcile()
        exp = registry.experiment(args.id)
        trials = registry.trials(exp.id)
        checkpoints = registry.checkpoints(experiment_id=exp.id)
        best = registry.best_checkpoints(exp.id, 1)
        recorded_jobs = {j.trial_id: j for j in registry.jobs(exp.id)}
        jobs = {trial_id: as_dict(j) for trial_id, j in recorded_jobs.items()}
        # Where each running trial runs, as its launcher's handle says (as pause/kill reach it).
        handles = {t.id: running_trial(t, recorded_jobs.get(t.id)) for t in trials}
        running = {i: h.describe() for i, h in handles.items() if h is not None}
        reports = registry.run_reports(exp.id)  # a Core API script's own word on its trial
        data = {
            **as_dict(exp),
            "config": redact_config(exp.config),
            "state": _state(exp, trials),
            "trials": [
                {
                    **as_dict(t),
                    "validation": [as_dict(m) for m in registry.metrics(t.id, "validation")],
                    "training": [as_dict(m) for m in registry.metrics(t.id, "training")],
                    # Other groups a Core API script reported (`report_metrics(group, ...)`).
                    "groups": _other_groups(registry, t.id),
                    "job": jobs.get(t.id),
                    "running": running.get(t.id),
                    "progress": getattr(reports.get(t.id), "progress", None),
                    "status": getattr(reports.get(t.id), "status", None),
                    "metadata": getattr(reports.get(t.id), "run_metadata", None),
                }
                for t in trials
            ],
            "checkpoints": [as_dict(c) for c in checkpoints],
            "best_checkpoint": as_dict(best[0]) if best else None,
            "log_directory": str(registry.workspace.experiment_dir(exp.id)),
            "mlflow": read_link(registry.workspace.experiment_dir(exp.id)) or None,
        }
    if args.json:
        _print_json(data)
        return 0
    metric = exp.searcher_metric
    print(f"Experiment {exp.id}: {exp.name or '(no name)'}  [{data['state']}]")
    print(f"  config:  {exp.config_path}")
    print(f"  context: {exp.context_dir}")
    order = "smaller is better" if exp.smaller_is_better else "larger is better"
    print(f"  searcher metric: {metric or '-'} ({order})")
    print(f"  created: {format_time(exp.created_at)}")
    print(f"  logs:    {data['log_directory']}")
    if data["mlflow"]:
        link = data["mlflow"]
        print(
            f"  MLflow:  experiment {link.get('mlflow_experiment_id')} "
            f"({link.get('experiment_name')}) at {link.get('tracking_uri')}"
        )
    print("Trials")
    rows = []
    for t in data["trials"]:
        vals = [v["values"].get(metric) for v in t["validation"] if metric in v["values"]]
        last = format_value(vals[-1]) if vals else "-"
        rows.append(
            (
                t["id"],
                t["state"],
                t["batches_trained"],
                t["epochs_trained"],
                format_time(t["start_time"]),
                format_time(t["end_time"]),
                last,
                json.dumps(t["hparams"], sort_keys=True),
            )
        )
    print(
        table(
            (
                "ID",
                "State",
                "Batches",
                "Epochs",
                "Start",
                "End",
                f"Last {metric or 'metric'}",
                "Hparams",
            ),
            rows,
            indent="  ",
        )
    )
    for t in data["trials"]:
        if t["message"]:
            print(f"  trial {t['id']}: {t['message']}")
        if t["running"]:
            print(f"  trial {t['id']}: runs now: {t['running']}")
        if t["progress"] is not None:
            print(f"  trial {t['id']}: progress {t['progress']:.0%}")
        if t["status"]:
            print(f"  trial {t['id']}: status: {t['status']}")
        if t["metadata"] is not None:
            shown_metadata = json.dumps(t["metadata"], sort_keys=True)
            if len(shown_metadata) > 200:
                shown_metadata = shown_metadata[:197] + "..."
            print(f"  trial {t['id']}: metadata: {shown_metadata}")
        job = t["job"]
        if job is not None:
            reason = f", {job['reason']}" if job["reason"] else ""
            print(
                f"  trial {t['id']}: {job['launcher']} job {job['job_id']} {job['state']}"
                f"{reason} (requeued {job['restarts']} times); output: {job['output']}"
            )
    print("Checkpoints")
    if checkpoints:
        print(_checkpoint_table(checkpoints, metric, indent="  "))
    else:
        print("  none")
    if best:
        print(f"Best checkpoint: {checkpoint_line(best[0], metric)}")
    return 0


def _checkpoint_table(checkpoints: list[Checkpoint], metric: str | None, indent: str = "") -> str:
    names = sorted({k for c in checkpoints for k in c.metrics})
    if metric is not None and metric in names:
        names.remove(metric)
        names.insert(0, metric)
    rows = [
        (
            c.uuid,
            c.experiment_id,
            c.trial_id,
            c.batches,
            c.epochs,
            *(format_value(c.metrics[n]) if n in c.metrics else "-" for n in names),
            c.location,
        )
        for c in checkpoints
    ]
    headers = ("UUID", "Experiment", "Trial", "Batch", "Epoch", *names, "Location")
    return table(headers, rows, indent=indent)


def experiment_continue(args: argparse.Namespace) -> int:
    from lightning_bridge.experiment.trials._experiments import continue_experiment

    with open_registry(args) as registry:
        if registry.experiment(args.id).options.get("search"):
            from lightning_bridge.experiment.cli._search_commands import continue_search

            launcher = getattr(args, "launcher", None)
            worker_jobs = getattr(args, "worker_jobs", None)
            return continue_search(registry, args.id, float(args.lost_after), launcher, worker_jobs)
        from lightning_bridge.experiment.launch._preflight import preflight
        from lightning_bridge.experiment.launch._registry import launcher_for

        if getattr(args, "worker_jobs", None) is not None:
            raise InvalidArgumentError(
                f"--worker-jobs runs a search's trials in Slurm worker jobs, and experiment "
                f"{args.id} is not a search; leave --worker-jobs out"
            )
        recorded = registry.experiment(args.id).options.get("launcher")
        name = getattr(args, "launcher", None) or recorded
        launcher = launcher_for(name)
        workspace = registry.workspace

        def checked(plan: Plan) -> None:
            """The one pre-flight, for the launcher the trials continue with."""
            options = dataclasses.replace(plan.options, launcher=name or plan.options.launcher)
            preflight(dataclasses.replace(plan, options=options), workspace)

        code, trials = continue_experiment(
            registry, args.id, args.from_command_line, run=launcher.run_trial, check=checked
        )
        if not trials:
            print(f"Experiment {args.id} is complete: every trial completed; nothing to continue.")
            return 0
        if code == 0:
            print(run_summary(registry, args.id, trials), flush=True)
        from lightning_bridge.tracking._sync import sync_after_run

        mirrored = sync_after_run(registry, args.id)
        if mirrored:
            print(mirrored, flush=True)
    return code


def _stop_trials(args: argparse.Namespace, kill: bool) -> int:
    """Stop every running trial of the experiment where it runs, as its launcher's handle
    reaches it (`running_trial`: its Slurm job, its process on this machine). Pause: the
    trial checkpoints and stops; kill: it ends now, recorded STOPPED."""
    from lightning_bridge.experiment.launch._contract import RunningTrial
    from lightning_bridge.experiment.launch._registry import running_trial
    from lightning_bridge.record._schema import TrialState

    verb = "killed" if kill else "paused"
    done = []
    signalled: set[str] = set()  # a search's worker job runs several trials: signalled once
    awaited: list[tuple[int, str, RunningTrial]] = []  # trial, where it runs, its handle
    with open_registry(args) as registry:
        registry.reconcile()
        registry.experiment(args.id)
        jobs = {j.trial_id: j for j in registry.jobs(args.id)}
        for trial in registry.trials(args.id):
            running = running_trial(trial, jobs.get(trial.id))
            if running is None:
                continue
            if kill:  # recorded first: whatever follows the trial takes its end for a kill
                registry.trial_ended(trial.id, TrialState.STOPPED, "killed", if_active=True)
            where = running.stop(registry, trial.id, kill, running.key not in signalled)
            signalled.add(running.key)
            done.append({"trial_id": trial.id, "where": where})
            awaited.append((trial.id, where, running))
        # Every trial signalled first, then each end awaited: a killed search's trials end
        # together, not one after the other (its coordinator would pause the others meanwhile).
        for trial_id, where, running in awaited if kill else []:
            running.wait_stopped()  # the trial's own last words come first
            if registry.trial(trial_id).state != TrialState.COMPLETED.value:
                registry.trial_ended(trial_id, TrialState.STOPPED, f"killed ({where})")
    if args.json:
        _print_json({"experiment_id": args.id, verb: done})
    elif not done:
        print(f"Experiment {args.id} has no running trial.")
    for item in [] if args.json else done:
        how = "killed" if kill else "checkpoints and stops"
        print(f"Trial {item['trial_id']} ({item['where']}): {how}")
    if done and not kill and not args.json:
        print(f"Continue with: lightning-bridge experiment continue {args.id}")
    return 0


def experiment_pause(args: argparse.Namespace) -> int:
    return _stop_trials(args, kill=False)


def experiment_kill(args: argparse.Namespace) -> int:
    return _stop_trials(args, kill=True)


def experiment_plot(args: argparse.Namespace) -> int:
    from lightning_bridge.experiment.cli._plot import plot_experiment

    out = args.out or pathlib.Path(f"experiment-{args.id}.png")
    with open_registry(args) as registry:
        written = plot_experiment(registry, args.id, out)
    if args.json:
        _print_json({"experiment_id": args.id, "png": str(written.resolve())})
    else:
        print(f"Wrote {written}")
    return 0


def _lines(path: pathlib.Path, tail: int | None) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    lines = text.splitlines()
    if tail is not None:
        lines = lines[-tail:] if tail > 0 else []
    return lines


def trial_logs(args: argparse.Namespace) -> int:
    """The trial's log; for a trial run as a scheduler's job, the job's output after it (what
    the job printed: progress, warnings, a crash's traceback)."""
    with open_registry(args) as registry:
        trial = registry.trial(args.id)
        job = registry.job(trial.id)
    log = pathlib.Path(trial.log_file)
    lines = _lines(log, args.tail)
    output = pathlib.Path(job.output) if job is not None else None
    job_lines = _lines(output, args.tail) if output is not None else []
    if args.json:
        data: dict[str, Any] = {"trial_id": trial.id, "log_file": str(log), "lines": lines}
        if job is not None:
            data.update(job=as_dict(job), job_output=job_lines)
        _print_json(data)
        return 0
    for line in lines:
        print(line)
    if not log.is_file():
        print(f"trial {trial.id} has no log yet ({log})", file=sys.stderr)
    if job is not None:
        print(f"--- {job.launcher} job {job.job_id} ({job.state}): {job.output} ---")
        for line in job_lines:
            print(line)
    return 0


def checkpoint_list(args: argparse.Namespace) -> int:
    with open_registry(args) as registry:
        if args.best is not None:
            experiments = (
                [args.experiment]
                if args.experiment is not None
                else [e.id for e in registry.experiments()]
            )
            found = [c for e in experiments for c in registry.best_checkpoints(e, args.best)]
            if args.trial is not None:
                found = [c for c in found if c.trial_id == args.trial]
        else:
            found = registry.checkpoints(experiment_id=args.experiment, trial_id=args.trial)
        metrics = {e.id: e.searcher_metric for e in registry.experiments()}
    if args.json:
        _print_json([as_dict(c) for c in found])
        return 0
    if not found:
        print("No checkpoints.")
        return 0
    single = {metrics[c.experiment_id] for c in found}
    print(_checkpoint_table(found, single.pop() if len(single) == 1 else None))
    return 0


def checkpoint_download(args: argparse.Namespace) -> int:
    from lightning_bridge._errors import InvalidArgumentError

    if str(args.uuid).startswith("models:/"):
        from lightning_bridge.experiment.cli._model_commands import model_download

        return model_download(args)
    from lightning_bridge.experiment.trials._checkpoints import trial_checkpoint_storage

    with open_registry(args) as registry:
        checkpoint = registry.checkpoint(args.uuid)
        if checkpoint is None or checkpoint.state != "COMPLETED":
            state = "is not in" if checkpoint is None else f"is {checkpoint.state.lower()} in"
            raise InvalidArgumentError(
                f"checkpoint {args.uuid} {state} the workspace {registry.workspace.root}; "
                "`lightning-bridge checkpoint list` shows the checkpoints kept."
            )
        experiment = registry.experiment(checkpoint.experiment_id)
        storage = trial_checkpoint_storage(registry, experiment, checkpoint.trial_id)
        out = storage.fetch(checkpoint.uuid, pathlib.Path(args.out).expanduser().resolve())
    if args.json:
        _print_json({**as_dict(checkpoint), "downloaded_to": str(out)})
    else:
        print(f"Downloaded checkpoint {checkpoint.uuid} from {checkpoint.location} to {out}")
    return 0


def _other_groups(registry: Registry, trial_id: int) -> dict[str, list[dict[str, Any]]]:
    """A trial's reports in groups other than training and validation, by group."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for m in registry.metrics(trial_id):
        if m.kind not in ("training", "validation"):
            groups.setdefault(m.kind, []).append(as_dict(m))
    return groups
