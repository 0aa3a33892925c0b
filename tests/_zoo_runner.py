"""Train a `tests/_zoo.py` case with `lightning.Trainer` and as a trial, and compare.

`run_lightning(case)` trains the module with the Trainer the case describes. `run_trial(api,
case)` trains `lightning_trial(module, datamodule, base=api.PyTorchTrial, callbacks=...)` with
`api.Trainer` (`lightning_bridge` or `determined.pytorch`) for the same length, validating as
often, with the experiment config a ported project has (searcher length, validation period).
Both return a `Run`: the final weights, what was validated, the optimizer steps taken.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

import torch

import lightning_bridge
from tests._zoo import Case

BRIDGE_TRAINER = {"enable_progress_bar": False, "enable_model_summary": False}


@dataclasses.dataclass
class Run:
    weights: dict[str, torch.Tensor]
    validations: list[dict[str, float]]
    # Per epoch: the mean of every value logged on_step in training, and the epoch values (for
    # modules without validation, whose trial reports these as validation metrics).
    step_means: list[dict[str, float]]
    global_step: int
    module: Any
    training_reports: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def epoch_len(case: Case) -> int:
    module = case.module(**case.constructor_hparams(case.module))
    dm = case.datamodule(**case.constructor_hparams(case.datamodule)) if case.datamodule else None
    if dm is not None:
        dm.setup("fit")
        return len(dm.train_dataloader())
    return len(module.train_dataloader())


def run_lightning(case: Case) -> Run:
    torch.manual_seed(0)
    module = case.module(**case.constructor_hparams(case.module))
    dm = case.datamodule(**case.constructor_hparams(case.datamodule)) if case.datamodule else None
    trainer = case.lightning_trainer()
    validations: list[dict[str, float]] = []
    step_means: list[dict[str, float]] = []
    sums: dict[str, list[float]] = {}
    callback_base = case.package().Callback

    class Record(callback_base):  # type: ignore[misc, valid-type]
        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            validations.append({k: float(v) for k, v in trainer.callback_metrics.items()})

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            for key, value in trainer.callback_metrics.items():
                if not key.endswith("_epoch"):
                    entry = sums.setdefault(key, [0.0, 0])
                    entry[0] += float(value)
                    entry[1] += 1

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            # The epoch-level values (Lightning's own computation at the epoch's end) win over
            # step means, which for them would mix in the previous epoch's value.
            epoch = trainer._logger_connector.metrics["callback"]
            means = {k: s / c for k, (s, c) in sums.items()}
            step_means.append({**means, **{k: float(v) for k, v in epoch.items()}})
            sums.clear()

    trainer.callbacks.append(Record())
    trainer.fit(module, datamodule=dm)
    return Run(weights(module), validations, step_means, int(trainer.global_step), module)


def trial_config(case: Case) -> dict[str, Any]:
    length = case.epochs if case.length_unit == "epochs" else case.epochs * epoch_len(case)
    return {
        "name": case.name,
        "hyperparameters": dict(case.hparams),
        "searcher": {
            "name": "single",
            "metric": case.metric,
            "smaller_is_better": case.smaller_is_better,
            "max_length": {case.length_unit: length},
        },
        "min_validation_period": {case.validate_unit: case.validate_every},
    }


def run_trial(api: ModuleType, case: Case) -> Run:
    config = trial_config(case)
    trial_cls = lightning_bridge.lightning_trial(
        case.module, case.datamodule, base=api.PyTorchTrial, callbacks=case.callbacks()
    )
    validations: list[dict[str, float]] = []
    reports: list[dict[str, Any]] = []

    class Record(api.PyTorchCallback):  # type: ignore[misc, name-defined]
        def on_validation_end(self, metrics: dict[str, Any]) -> None:
            validations.append({k: float(v) for k, v in metrics.items()})

        def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
            reports.append(dict(avg_metrics))

    extra = {"trainer_kwargs": BRIDGE_TRAINER} if api is lightning_bridge else {}
    with api.init(
        hparams=dict(case.hparams),
        exp_conf=config,
        aggregation_frequency=case.aggregation,
        enable_tensorboard_logging=False,
        **extra,
    ) as ctx:
        torch.manual_seed(0)
        trial = trial_cls(ctx)
        own = trial.build_callbacks
        trial.build_callbacks = lambda: {**own(), "record": Record()}
        ((unit, length),) = config["searcher"]["max_length"].items()
        api.Trainer(trial, ctx).fit(
            max_length=api.Epoch(length) if unit == "epochs" else api.Batch(length),
            validation_period=(api.Epoch if case.validate_unit == "epochs" else api.Batch)(
                case.validate_every
            ),
            reporting_period=api.Epoch(1),
            checkpoint_policy="none",
        )
    module = trial.lightning_module
    return Run(weights(module), validations, [], int(module.trainer.global_step), module, reports)
