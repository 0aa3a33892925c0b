"""`lightning-bridge experiment plot ID`: the training and validation curves of each trial.

One panel per metric (training metrics first, then validation), one line per trial, against
the batches trained; written as a PNG with matplotlib (the `plot` extra).
"""

from __future__ import annotations

import pathlib

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.record._registry import Registry


def _series(registry: Registry, trial_id: int, kind: str) -> dict[str, tuple[list, list]]:
    curves: dict[str, tuple[list, list]] = {}
    for report in registry.metrics(trial_id, kind):
        for name, value in report.values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                xs, ys = curves.setdefault(name, ([], []))
                xs.append(report.batches)
                ys.append(float(value))
    return curves


def plot_experiment(registry: Registry, experiment_id: int, out: pathlib.Path) -> pathlib.Path:
    """Write the experiment's curves to `out` (a PNG); returns it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidArgumentError(
            "experiment plot needs matplotlib: pip install 'lightning-bridge[plot]'"
        ) from None
    experiment = registry.experiment(experiment_id)
    trials = registry.trials(experiment_id)
    panels: dict[tuple[str, str], dict[int, tuple[list, list]]] = {}
    for kind in ("training", "validation"):
        for trial in trials:
            for name, series in _series(registry, trial.id, kind).items():
                panels.setdefault((kind, name), {})[trial.id] = series
    if not panels:
        raise InvalidArgumentError(
            f"experiment {experiment_id} has no recorded metrics yet; nothing to plot."
        )
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    for ax, ((kind, name), by_trial) in zip(axes.flat, panels.items(), strict=False):
        for trial_id, (xs, ys) in sorted(by_trial.items()):
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=f"trial {trial_id}")
        ax.set_title(f"{kind}: {name}")
        ax.set_xlabel("batches")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    title = f"Experiment {experiment_id}" + (f" ({experiment.name})" if experiment.name else "")
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
