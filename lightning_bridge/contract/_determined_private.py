"""Determined's private context attributes that trials read, as the bridge answers them.

Trials read some of Determined's private context attributes (its AMP test fixture reads
`context._aggregation_frequency`, examples and model_hub read `context._epoch_len` and
`context._current_batch_idx`): `DETERMINED_PRIVATE_NAMES` lists those the bridge keeps, each
with Determined's value (`FitValue`: a read-only attribute whose value comes from the running
fit); `not_kept` answers the others Determined has with a message naming what to use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_bridge._errors import InvalidTrialError

# Determined's private attributes that trials read, kept with Determined's values (read through
# the context; dotted names through its `distributed` / `experimental` parts).
DETERMINED_PRIVATE_NAMES = (
    "_aggregation_frequency",
    "_epoch_len",
    "_current_batch_idx",
    "_hparams",
    "_exp_conf",
    "_trial_seed",
    "_per_slot_batch_size",
    "_global_batch_size",
    "_scaler",
    "_use_apex",
    "_stop_requested",
    "_enable_tensorboard_logging",
    "distributed._is_chief",
    "distributed._is_local_chief",
    "experimental._auto_amp",
    "experimental._data_repro_checks_disabled",
    "experimental._auto_to_device",
)

# The private attributes of Determined's context the bridge does not keep, and what to use.
_NOT_KEPT = {
    "_core": "Determined's Core API (reporting to a master) is not mapped onto the bridge",
    "_num_gpus": "read context.device (a GPU when its type is 'cuda')",
    "_steps_completed": "call context.get_initial_batch()",
    "_main_model": "read context.models",
    "_wrapped_models": "read context.models",
    "_optimizer_configs": "read context.optimizers",
    "_tbd_writer": "call context.get_tensorboard_writer()",
    "_distributed_backend": "read context.distributed",
    "_managed_training": "the bridge always manages training",
    "_debug_enabled": "the bridge has no debug mode; set the log level instead",
    "_fp16_compression_default": "the bridge does not compress gradients",
    "_average_aggregated_gradients_default": "pass average_aggregated_gradients to "
    "wrap_optimizer()",
    "_loss_ids": "apex is not used",
    "_last_backward_batch_idx": "apex is not used",
    "_is_pre_trainer": "the bridge runs the Trainer API",
    "_last_tb_reset_ts": "the bridge writes TensorBoard files directly",
    "_to_device_warned_types": "internal to Determined's to_device()",
}


class FitValue:
    """A read-only attribute of Determined's context whose value comes from the running fit;
    writing it says what sets it instead."""

    def __init__(self, read: Callable[[Any], Any], set_by: str) -> None:
        self._read = read
        self._set_by = set_by

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, instance: Any, owner: type) -> Any:
        return self if instance is None else self._read(instance)

    def __set__(self, instance: Any, value: Any) -> None:
        raise InvalidTrialError(f"context.{self._name} is read-only: {self._set_by}.")


def not_kept(owner: object, name: str) -> AttributeError:
    """The error for reading `name` on the context `owner` does not have: for a private
    attribute of Determined's context the bridge does not keep, what to use instead."""
    hint = _NOT_KEPT.get(name)
    if hint is None:
        return AttributeError(f"{type(owner).__name__!r} object has no attribute {name!r}")
    return AttributeError(
        f"context.{name} is private state of Determined's context that lightning_bridge "
        f"does not keep: {hint}. The private attributes it keeps, with Determined's values: "
        f"{', '.join(DETERMINED_PRIVATE_NAMES)}."
    )
