"""What the commands print: metric values, tables, and the end-of-run summary.

The summary is read back from the record, so a trial class and a training script end with the
same report: the last metrics, the best checkpoint, where the logs are and the TensorBoard
command that shows them.
"""

from __future__ import annotations

import datetime
import math
import pathlib
import shlex
from collections.abc import Sequence
from typing import Any

from lightning_bridge.record._records import Checkpoint, Trial
from lightning_bridge.record._registry import Registry


def format_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value) and value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-4):
            return f"{value:.6e}"
        return f"{value:.6f}"
    try:
        return format_value(float(value))
    except (TypeError, ValueError):
        return str(value)


def format_time(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "") -> str:
    """Columns padded to their widest cell, a dashed rule under the headers."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = [indent + "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append(indent + "  ".join("-" * w for w in widths))
    lines += [
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]
    return "\n".join(lines)


def metrics_table(title: str, metrics: dict[str, Any]) -> list[str]:
    rows = [(name, format_value(metrics[name])) for name in sorted(metrics)]
    return [title, table(("metric", "value"), rows, indent="  ")]


def checkpoint_line(checkpoint: Checkpoint, metric: str | None) -> str:
    value = checkpoint.metrics.get(metric) if metric else None
    shown = f", {metric} {format_value(value)}" if value is not None else ""
    return f"{checkpoint.uuid} (batch {checkpoint.batches}{shown}): {checkpoint.location}"


def log_dirs(trial: Trial) -> tuple[pathlib.Path | None, pathlib.Path | None]:
    """The trial's TensorBoard and CSV log folders (None where it wrote none)."""
    run_dir = pathlib.Path(trial.run_dir)
    tensorboard = run_dir / "tensorboard"
    csv = run_dir / "csv_logs"
    return (tensorboard if tensorboard.is_dir() else None, csv if csv.is_dir() else None)


def trial_summary(registry: Registry, trial: Trial, metric: str | None) -> list[str]:
    lines = [
        f"Trial {trial.id}: {trial.state} after {trial.batches_trained} batches "
        f"({trial.epochs_trained} epochs)" + (f": {trial.message}" if trial.message else "")
    ]
    validations = registry.metrics(trial.id, "validation")
    trainings = registry.metrics(trial.id, "training")
    if validations:
        last = validations[-1]
        lines += metrics_table(f"Last validation metrics (batch {last.batches})", last.values)
    else:
        lines.append("No validation ran.")
    if trainings:
        last = trainings[-1]
        lines += metrics_table(f"Last training metrics (batch {last.batches})", last.values)
    tensorboard, csv = log_dirs(trial)
    lines.append(f"Trial log: {trial.log_file}")
    if csv is not None:
        lines.append(f"CSV logs: {csv}")
    if tensorboard is not None:
        lines.append(f"TensorBoard logs: {tensorboard}")
    return lines


def run_summary(registry: Registry, experiment_id: int, trial_ids: Sequence[int]) -> str:
    """The end of a run: each trial's last metrics, the best checkpoint, logs, TensorBoard."""
    experiment = registry.experiment(experiment_id)
    metric = experiment.searcher_metric
    name = f" ({experiment.name})" if experiment.name else ""
    lines = [f"Experiment {experiment_id}{name}"]
    trials = [registry.trial(t) for t in trial_ids]
    for trial in trials:
        lines += trial_summary(registry, trial, metric)
    kept = registry.checkpoints(experiment_id=experiment_id)
    best = registry.best_checkpoints(experiment_id, 1)
    if best:
        lines.append(f"Best checkpoint: {checkpoint_line(best[0], metric)}")
    elif kept:
        lines.append(f"Latest checkpoint: {checkpoint_line(kept[-1], metric)}")
    else:
        lines.append("No checkpoint was kept.")
    if kept:
        lines.append(
            f"Checkpoints kept: {len(kept)} (lightning-bridge checkpoint list --experiment "
            f"{experiment_id})"
        )
    log_dir = registry.workspace.experiment_dir(experiment_id)
    lines.append(f"Log directory: {log_dir}")
    if any(log_dirs(t)[0] is not None for t in trials):
        lines.append(f"TensorBoard: tensorboard --logdir {shlex.quote(str(log_dir))}")
    return "\n".join(lines)
