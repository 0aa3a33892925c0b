"""`self.log` / `self.log_dict` of a ported LightningModule, as the trial's metrics.

Values are kept in Lightning's own result collections, so the step values, the epoch
aggregates (`reduce_fx` mean weighted by batch size, sum, max, min) and torchmetrics objects
(`compute()` at epoch end, then `reset()`) are exactly what Lightning would log, under the
names Lightning gives them (`_metric_values`). They reach the trial through two metric reducers
registered with `context.wrap_reducer`, which both Determined's and the bridge's trainers
reduce across processes:

- training: the mean of each step value over the reporting window (plus `loss`, the training
  step's loss, unless the module logs a metric of that name, and what callbacks such as
  LearningRateMonitor log), and the epoch-level values of the epoch that ended in the window;
- validation: the epoch-level values of the validation pass; for a module without
  `validation_step`, the values of the last training epoch (epoch-level values, and the epoch
  mean of each step value and of the loss), so the searcher has a metric.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
from torchmetrics import Metric

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._metric_values import (
    Partial,
    epoch_values,
    live_items,
    partial_results,
    scalar,
)
from lightning_bridge.translation._lightning_private import (
    _FxValidator,
    _get_default_dtype,
    _ResultCollection,
    _sync_ddp_if_available,
    current_hook,
    forked_names,
    step_value,
)


def _is_validation_hook(fx: str) -> bool:
    return "validation" in fx


class LogRouter:
    """The module's `self.log` target: Lightning result collections plus reporting state."""

    def __init__(self, distributed: Callable[[], bool]) -> None:
        self.train = _ResultCollection(training=True)
        self.val = _ResultCollection(training=False)
        self._callback: dict[str, torch.Tensor] = {}
        self._epoch_end_reached = False
        self._distributed = distributed
        self._logged_now: set[str] = set()
        # Training reporting window: step values (sum, count) and finished-epoch values.
        self.window_steps: dict[str, list[float]] = {}
        self.window_epoch: dict[str, torch.Tensor] = {}
        self.window_loss: list[float] = [0.0, 0]
        self.window_plain: dict[str, str] = {}
        # The epoch's end is deferred (validation first, as in Lightning): a report in between
        # takes the epoch values computed so far; these are not reported twice.
        self.epoch_pending = False
        self._reported_early: set[str] = set()
        # Step values (sum, count) and loss of the running epoch, and the last epoch's values:
        # a module without validation_step reports these as its validation metrics.
        self._epoch_steps: dict[str, list[float]] = {}
        self._epoch_loss: list[float] = [0.0, 0]
        self.last_epoch: dict[str, Partial] | None = None

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """What `trainer.callback_metrics` holds; once the training epoch's end is reached,
        its epoch values are computed when read (as Lightning computes them)."""
        if self._epoch_end_reached:
            self._callback.update(epoch_values(self.train)[1])
        return self._callback

    # ----- self.log -----

    def log(
        self,
        module: Any,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: str | Callable = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any | None = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        metric_attribute: str | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Record one logged value, with Lightning's defaults and checks for the hook."""
        fx = current_hook(module)
        if fx is None:
            raise InvalidTrialError(
                f"self.log({name!r}, ...) was called outside the hooks LightningAdapter runs; "
                "log from training_step, validation_step or their batch and epoch hooks."
            )
        if isinstance(value, dict):
            raise InvalidTrialError(
                f"self.log({name!r}, ...) got a dict; log each entry, or use self.log_dict()."
            )
        if not isinstance(value, (numbers.Number, torch.Tensor, Metric)):
            raise InvalidTrialError(
                f"self.log({name!r}, ...) got a {type(value).__name__}; log a number, a "
                "one-element tensor or a torchmetrics Metric."
            )
        on_step, on_epoch = _FxValidator.check_logging_and_get_default_levels(
            fx, on_step=on_step, on_epoch=on_epoch
        )
        if isinstance(value, numbers.Number):
            value = torch.tensor(value, device=module.device, dtype=_get_default_dtype())
        elif isinstance(value, torch.Tensor) and value.numel() != 1:
            raise InvalidTrialError(
                f"self.log({name!r}, ...) got a tensor of {value.numel()} elements; log a "
                "one-element tensor (e.g. its mean)."
            )
        results = self.val if _is_validation_hook(fx) else self.train
        results.log(
            fx,
            name,
            value,
            prog_bar=prog_bar,
            logger=True if logger is None else bool(logger),
            on_step=on_step,
            on_epoch=on_epoch,
            reduce_fx=reduce_fx,
            enable_graph=enable_graph,
            add_dataloader_idx=add_dataloader_idx,
            batch_size=batch_size,
            sync_dist=bool(sync_dist) and self._distributed(),
            sync_dist_fn=_sync_fn if sync_dist else _no_sync,
            sync_dist_group=sync_dist_group,
            metric_attribute=metric_attribute,
            rank_zero_only=rank_zero_only,
        )
        self._logged_now.add(f"{fx}.{name}")

    # ----- batches -----

    def start_batch(
        self, results: _ResultCollection, batch: Any, dataloader_idx: int | None = None
    ) -> None:
        results.batch = batch
        results.batch_size = None
        results.dataloader_idx = dataloader_idx

    def end_batch(self, results: _ResultCollection) -> None:
        results.batch = None
        results.batch_size = None

    def finish_training_batch(self, loss: torch.Tensor | None) -> None:
        """Add this batch's step values to the window and to `callback_metrics`."""
        for metric in live_items(self.train):
            key = f"{metric.meta.fx}.{metric.meta.name}"
            if key not in self._logged_now or not metric.meta.on_step:
                continue
            value = step_value(metric)
            if not isinstance(value, torch.Tensor):
                continue
            value = value.detach()
            name, forked = forked_names(self.train, metric, True)
            self._callback[name] = value
            self._callback[forked] = value
            if metric.meta.logger:
                self._add(self.window_steps, forked, float(value))
                if forked != name:
                    self.window_plain[forked] = name
                else:
                    self._add(self._epoch_steps, name, float(value))
        self._logged_now.clear()
        if loss is not None:
            for totals in (self.window_loss, self._epoch_loss):
                totals[0] += float(loss.detach())
                totals[1] += 1

    @staticmethod
    def _add(sums: dict[str, list[float]], name: str, value: float) -> None:
        entry = sums.setdefault(name, [0.0, 0])
        entry[0] += value
        entry[1] += 1

    def add_logged(self, metrics: dict[str, Any]) -> None:
        """Values a callback logged through `trainer.loggers` (LearningRateMonitor)."""
        for name, value in metrics.items():
            self._add(self.window_steps, name, float(value))

    # ----- training epochs -----

    def epoch_end_reached(self) -> None:
        """From now until the epoch's values are final, `callback_metrics` includes them."""
        self._epoch_end_reached = True

    def finish_training_epoch(self) -> None:
        """Epoch-level training values (after `on_train_epoch_end`); then reset, as Lightning."""
        reported, callback = epoch_values(self.train)
        self.window_epoch.update(
            {k: v for k, v in reported.items() if k not in self._reported_early}
        )
        self._callback.update(callback)
        self._epoch_end_reached = False
        last: dict[str, Partial] = {k: ("value", scalar(v), None) for k, v in reported.items()}
        for name, (total, count) in self._epoch_steps.items():
            last.setdefault(name, ("mean", total, count))
        if "loss" not in last and self._epoch_loss[1]:
            last["loss"] = ("mean", self._epoch_loss[0], self._epoch_loss[1])
        self.last_epoch = last
        self._epoch_steps, self._epoch_loss = {}, [0.0, 0]
        self.train.reset()
        self._logged_now.clear()
        self.epoch_pending = False
        self._reported_early = set()

    # ----- validation -----

    def finish_validation_epoch(self) -> None:
        """`callback_metrics` from the validation pass (after `on_validation_epoch_end`)."""
        self._callback.update(epoch_values(self.val)[1])
        self._logged_now.clear()

    # ----- reducer states -----

    def training_state(self) -> dict[str, Any]:
        steps = {k: (v[0], v[1]) for k, v in self.window_steps.items()}
        if "loss" not in steps and self.window_loss[1]:
            # The training step's loss, unless the module logs a "loss" of its own.
            steps["loss"] = (self.window_loss[0], self.window_loss[1])
        epoch = dict(self.window_epoch)
        if self.epoch_pending:
            early = {k: v for k, v in epoch_values(self.train)[0].items()}
            self._reported_early.update(early)
            epoch.update(early)
        return {
            "steps": steps,
            "epoch": {k: scalar(v) for k, v in epoch.items()},
            "plain": dict(self.window_plain),
        }

    def reset_window(self) -> None:
        self.window_steps = {}
        self.window_epoch = {}
        self.window_loss = [0.0, 0]
        self.window_plain = {}

    def validation_state(self) -> dict[str, Partial]:
        """Per-process partial results of each epoch-level validation value."""
        return partial_results(self.val)

    def training_as_validation(self) -> dict[str, Partial]:
        """The last training epoch's values (before the first epoch ends: the running one's)."""
        if self.last_epoch is not None:
            return dict(self.last_epoch)
        running = partial_results(self.train)
        for name, (total, count) in self._epoch_steps.items():
            running.setdefault(name, ("mean", total, count))
        if "loss" not in running and self._epoch_loss[1]:
            running["loss"] = ("mean", self._epoch_loss[0], self._epoch_loss[1])
        return running


def _no_sync(value: Any, *args: Any, **kwargs: Any) -> Any:
    return value


def _sync_fn(value: Any, group: Any = None, reduce_op: Any = None) -> Any:
    return _sync_ddp_if_available(value, group, reduce_op=reduce_op)
