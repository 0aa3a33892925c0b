"""The trials a search gives under the installed Optuna, to compare across Optuna releases.

The search layer keeps Determined's searchers on an Optuna storage: its own sampler
(`DeterminedSampler`, which draws each trial's values from the experiment seed as Determined
does) and pruner (`DeterminedPruner`, Determined's rungs), so Optuna's own sampler defaults
(TPE's multivariate mode, constant liar, its startup trials) are never used. What does depend
on Optuna is the storage and the study's API: `enqueue_trial` and `ask` handing the waiting
trials out in order, `report` / `should_prune` reaching the pruner, `tell`, user attributes.
This script runs one config per searcher (random, grid, adaptive_asha) with one seed to its
end on a journal file, one trial at a time, each trial's metric a fixed function of its
hyperparameters and length, and prints every trial in creation order (values, seed, state,
metrics) and one digest of them all.

    python bench/optuna_versions.py [--json FILE]

Run it under each Optuna (a virtual environment with `optuna==X pydantic pyyaml sqlalchemy`
and this checkout on PYTHONPATH; torch and Lightning are not imported) and compare the
digests; `--json` keeps the trials for a diff.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import pathlib
import sys
import tempfile
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lightning_bridge.search._driver import SearchDriver  # noqa: E402
from lightning_bridge.search._searchers import SEARCHER  # noqa: E402
from lightning_bridge.search._views import SearchSpec  # noqa: E402

SEED = 1234
HYPERPARAMETERS: dict[str, Any] = {
    "global_batch_size": 16,
    "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1, "count": 3},
    "width": {"type": "int", "minval": 8, "maxval": 64, "count": 2},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5, "count": 2},
    "act": {"type": "categorical", "vals": ["relu", "tanh"]},
    "opt": {"momentum": {"type": "double", "minval": 0.5, "maxval": 0.99, "count": 1}},
}
SEARCHERS: dict[str, dict[str, Any]] = {
    "random": {"name": "random", "metric": "loss", "max_trials": 6, "max_length": 8},
    "grid": {"name": "grid", "metric": "loss", "max_length": 8},
    "adaptive_asha": {
        "name": "adaptive_asha", "metric": "loss", "max_trials": 12, "max_time": 16,
        "time_metric": "batches", "divisor": 2, "max_rungs": 3, "mode": "standard",
        "max_concurrent_trials": 1,
    },
}  # fmt: skip


def metric(hparams: dict[str, Any], length: int) -> float:
    """A made-up validation loss: a fixed function of the trial's values and length."""
    lr, width = float(hparams["lr"]), int(hparams["width"])
    shape = abs(math.log10(lr) + 2.5) + 8.0 / width + float(hparams["dropout"])
    shape += 0.1 if hparams["act"] == "tanh" else 0.0
    return round(shape / math.sqrt(length) + 1.0 - float(hparams["opt"]["momentum"]) / 4, 12)


def run_search(name: str, folder: pathlib.Path) -> list[dict[str, Any]]:
    """The search of `name` to its end, one trial at a time; its trials in creation order."""
    spec = SearchSpec(SEARCHER.validate_python(SEARCHERS[name]), HYPERPARAMETERS, SEED)
    driver = SearchDriver(str(folder / f"{name}.journal"), name, spec, worker="bench")
    length = int(SEARCHERS[name].get("max_length") or SEARCHERS[name]["max_time"])
    while (trial := driver.next_trial()) is not None or not driver.is_finished():
        assert trial is not None, "one trial at a time: a search never waits on another"
        at = trial.rungs[0] if trial.rungs else length
        while True:
            decision = driver.report(trial, at, metric(trial.hparams, at))
            if decision.stop or decision.next_rung is None:
                break
            at = decision.next_rung
        driver.complete(trial)
    return [
        {
            "number": view.number,
            "state": view.state,
            "seed": view.seed,
            "bracket": view.bracket,
            "hparams": view.hparams,
            "metrics": {str(k): v for k, v in sorted(view.metrics.items())},
        }
        for view in driver.trials()
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=pathlib.Path, default=None, help="keep the trials here")
    args = parser.parse_args()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in SEARCHERS:
            results[name] = run_search(name, pathlib.Path(folder))
    print(f"optuna {optuna.__version__}, experiment seed {SEED}")
    for name, trials in results.items():
        states: dict[str, int] = {}
        for trial in trials:
            states[trial["state"]] = states.get(trial["state"], 0) + 1
        print(f"\n{name}: {len(trials)} trials {states}")
        for trial in trials:
            values = json.dumps(trial["hparams"], sort_keys=True)
            print(f"  {trial['number']:>2} seed {trial['seed']:>10} {trial['state']:<9} {values}")
    text = json.dumps(results, sort_keys=True)
    print(f"\ndigest of every trial: {hashlib.sha256(text.encode()).hexdigest()[:16]}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
