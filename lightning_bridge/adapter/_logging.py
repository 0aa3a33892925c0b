"""`self.log` / `self.log_dict` of a ported LightningModule, as the trial's metrics.

Values are kept in Lightning's own result collections, so the step values, the epoch
aggregates (`reduce_fx` mean weighted by batch size, sum, max, min) and torchmetrics objects
(`compute()` at epoch end, then `reset()`) are exactly what Lightning would log. They reach the
trial through two metric reducers registered with `context.wrap_reducer`, which both
Determined's and the bridge's trainers reduce across processes:

- training: the mean of each step value over the reporting window (plus `loss`, the training
  step's loss, unless the module logs a metric of that name), and the epoch-level values of
  the epoch that ended in the window;
- validation: the epoch-level values of the validation pass.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
from torchmetrics import Metric

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._lightning_private import (
    _FxValidator,
    _get_default_dtype,
    _ResultCollection,
)


def _is_validation_hook(fx: str) -> bool:
    return "validation" in fx


def _scalar(value: Any) -> torch.Tensor:
    return value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value


class LogRouter:
    """The module's `self.log` target: Lightning result collections plus reporting state."""

    def __init__(self, distributed: Callable[[], bool]) -> None:
        self.train = _ResultCollection(training=True)
        self.val = _ResultCollection(training=False)
        self.callback_metrics: dict[str, torch.Tensor] = {}
        self._distributed = distributed
        self._logged_now: set[str] = set()
        # Training reporting window: step values (sum, count) and finished-epoch values.
        self.window_steps: dict[str, list[float]] = {}
        self.window_epoch: dict[str, torch.Tensor] = {}
        self.window_loss: list[float] = [0.0, 0]

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
        fx = module._current_fx_name
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

    def start_batch(self, results: _ResultCollection, batch: Any) -> None:
        results.batch = batch
        results.batch_size = None

    def end_batch(self, results: _ResultCollection) -> None:
        results.batch = None
        results.batch_size = None

    def finish_training_batch(self, loss: torch.Tensor | None) -> None:
        """Add this batch's step values to the window and to `callback_metrics`."""
        for key, metric in self.train.valid_items():
            if key not in self._logged_now or not metric.meta.on_step:
                continue
            value = metric._forward_cache
            if not isinstance(value, torch.Tensor):
                continue
            value = value.detach()
            self.callback_metrics[metric.meta.name] = value
            self.callback_metrics[metric.meta.forked_name(True)] = value
            if metric.meta.logger:
                self._add_step(metric.meta.forked_name(True), float(value))
        self._logged_now.clear()
        if loss is not None:
            self.window_loss[0] += float(loss.detach())
            self.window_loss[1] += 1

    def _add_step(self, name: str, value: float) -> None:
        entry = self.window_steps.setdefault(name, [0.0, 0])
        entry[0] += value
        entry[1] += 1

    def finish_training_epoch(self) -> None:
        """Epoch-level training values (after `on_train_epoch_end`); then reset, as Lightning."""
        log, callback = _epoch_values(self.train)
        self.window_epoch.update(log)
        self.callback_metrics.update(callback)
        self.train.reset()
        self._logged_now.clear()

    def finish_validation_epoch(self) -> None:
        """`callback_metrics` from the validation pass (after `on_validation_epoch_end`)."""
        _, callback = _epoch_values(self.val)
        self.callback_metrics.update(callback)
        self._logged_now.clear()

    # ----- reducer states -----

    def training_state(self) -> dict[str, Any]:
        steps = {k: (v[0], v[1]) for k, v in self.window_steps.items()}
        if "loss" not in steps and self.window_loss[1]:
            # The training step's loss, unless the module logs a "loss" of its own.
            steps["loss"] = (self.window_loss[0], self.window_loss[1])
        return {
            "steps": steps,
            "epoch": {k: _scalar(v) for k, v in self.window_epoch.items()},
        }

    def reset_window(self) -> None:
        self.window_steps = {}
        self.window_epoch = {}
        self.window_loss = [0.0, 0]

    def validation_state(self) -> dict[str, tuple[str, Any, Any]]:
        """Per-process partial results of each epoch-level validation value."""
        out: dict[str, tuple[str, Any, Any]] = {}
        for _, metric in self.val.valid_items():
            meta = metric.meta
            if not meta.on_epoch or not meta.logger:
                continue
            name = meta.forked_name(False)
            if not metric.is_tensor:
                out[name] = ("value", _scalar(metric.compute()), None)
            elif meta.is_mean_reduction:
                out[name] = ("mean", _scalar(metric.value), _scalar(metric.cumulated_batch_size))
            elif meta.is_sum_reduction:
                out[name] = ("sum", _scalar(metric.value), None)
            elif meta.is_max_reduction:
                out[name] = ("max", _scalar(metric.value), None)
            else:
                out[name] = ("min", _scalar(metric.value), None)
        return out


def _epoch_values(results: _ResultCollection) -> tuple[dict[str, Any], dict[str, Any]]:
    log: dict[str, Any] = {}
    callback: dict[str, Any] = {}
    for _, metric in results.valid_items():
        if not metric.meta.on_epoch:
            continue
        value = metric.compute()
        if not isinstance(value, torch.Tensor):
            raise InvalidTrialError(
                f"The metric logged as {metric.meta.name!r} computed a "
                f"{type(value).__name__}; its compute() must return a tensor."
            )
        value = value.detach()
        forked = metric.meta.forked_name(False)
        if metric.meta.logger:
            log[forked] = value
        callback[metric.meta.name] = value
        callback[forked] = value
    return log, callback


def combine_training(per_slot: list[dict[str, Any]]) -> dict[str, Any]:
    """Window means of step values and slot means of epoch values, across processes."""
    sums: dict[str, list[float]] = {}
    epoch: dict[str, list[Any]] = {}
    for slot in per_slot:
        for key, (total, count) in slot["steps"].items():
            entry = sums.setdefault(key, [0.0, 0])
            entry[0] += total
            entry[1] += count
        for key, value in slot["epoch"].items():
            epoch.setdefault(key, []).append(value)
    out: dict[str, Any] = {k: s / c for k, (s, c) in sums.items() if c}
    for key, values in epoch.items():
        out[key] = torch.stack([torch.as_tensor(v) for v in values]).mean(dim=0)
    return out


def combine_validation(per_slot: list[dict[str, tuple[str, Any, Any]]]) -> dict[str, Any]:
    """Each epoch-level validation value over every process's batches."""
    out: dict[str, Any] = {}
    for key in per_slot[0] if per_slot else {}:
        parts = [slot[key] for slot in per_slot if key in slot]
        kind = parts[0][0]
        values = [torch.as_tensor(p[1]) for p in parts]
        if kind == "mean":
            total = values[0]
            count = torch.as_tensor(parts[0][2])
            for value, part in zip(values[1:], parts[1:], strict=True):
                total = total + value
                count = count + torch.as_tensor(part[2])
            out[key] = total / count
        elif kind == "sum":
            out[key] = torch.stack(values).sum(dim=0)
        elif kind == "max":
            out[key] = torch.stack(values).max(dim=0).values
        elif kind == "min":
            out[key] = torch.stack(values).min(dim=0).values
        else:
            out[key] = torch.stack(values).float().mean(dim=0)
    return out


def _no_sync(value: Any, *args: Any, **kwargs: Any) -> Any:
    return value


def _sync_fn(value: Any, group: Any = None, reduce_op: Any = None) -> Any:
    from lightning_bridge.adapter._lightning_private import _sync_ddp_if_available

    return _sync_ddp_if_available(value, group, reduce_op=reduce_op)
