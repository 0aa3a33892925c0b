"""The trial's checkpoint payload: what `state_dict.pth` holds, built and applied.

`trial_payload` gathers the trial's models, optimizers, LR schedulers, callbacks, gradient
scaler and RNG states (plus the bridge's own entry: the data position and gradients
accumulated towards a step not yet taken); `apply_payload` puts them back. A save is taken in
two parts, with the trial callbacks' save hooks in Determined's order: `prepare_save` while
training is paused, then the files (`write_prepared` now, or the `Checkpointer`'s background
writer); `save_checkpoint` does both at once.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import random
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np
import torch

from lightning_bridge._secrets import redact_config, secret_values
from lightning_bridge.checkpoint._layout import EXTRAS_KEY, TrialState, write_checkpoint
from lightning_bridge.checkpoint._models import check_count, entries, load_models
from lightning_bridge.contract._callback import overrides
from lightning_bridge.contract._context import (
    PyTorchTrialContext,
    checkpoint_configs,
    context_setup,
    trial_scaler,
)

logger = logging.getLogger("lightning_bridge")


class PayloadSource(Protocol):
    """What the payload functions need of the object driving a trial (`TrialCore`)."""

    state: TrialState
    trial_callbacks: dict[str, Any]

    @property
    def context(self) -> PyTorchTrialContext: ...

    @property
    def trial(self) -> Any: ...

    def data_state(self) -> dict[str, Any]: ...

    def gradient_scaler(self) -> Any:
        """The engine's precision-plugin gradient scaler, if it has one."""


# ----- RNG state in a form `torch.load(weights_only=True)` accepts -----


def capture_rng_state() -> dict[str, Any]:
    """Every RNG the training loop draws from; numpy's key is stored as a uint32 tensor (its
    own type, which `np.random.set_state` accepts as is)."""
    np_state: Any = np.random.get_state()
    state: dict[str, Any] = {
        "cpu_rng_state": torch.random.get_rng_state(),
        "np_rng_state": (
            str(np_state[0]),
            torch.from_numpy(np.array(np_state[1], dtype=np.uint32)),
            int(np_state[2]),
            int(np_state[3]),
            float(np_state[4]),
        ),
        "random_rng_state": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.device_count():
        state["gpu_rng_state"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    np_state = state["np_rng_state"]
    if isinstance(np_state, tuple) and len(np_state) == 5:
        key = np_state[1]
        if isinstance(key, torch.Tensor):
            key = key.numpy()
        np.random.set_state((np_state[0], np.asarray(key, dtype=np.uint32), *np_state[2:]))
    else:
        np.random.set_state(np_state)
    random.setstate(state["random_rng_state"])
    torch.random.set_rng_state(state["cpu_rng_state"])
    if "gpu_rng_state" in state and torch.cuda.is_available() and torch.cuda.device_count():
        torch.cuda.set_rng_state(state["gpu_rng_state"])


def _scaler(module: PayloadSource) -> Any:
    return trial_scaler(module.context) or module.gradient_scaler()


def trial_payload(module: PayloadSource) -> dict[str, Any]:
    """The contents of `state_dict.pth` for the module's trial."""
    ctx = module.context
    scaler = _scaler(module)
    extra = {} if scaler is None else {"scaler_state_dict": scaler.state_dict()}
    return {
        **extra,
        "models_state_dict": [m.state_dict() for m in ctx.models],
        "optimizers_state_dict": [o.state_dict() for o in ctx.optimizers],
        "lr_schedulers_state_dict": [s.state_dict() for s in ctx.lr_schedulers],
        "callbacks": {name: cb.state_dict() for name, cb in module.trial_callbacks.items()},
        "rng_state": capture_rng_state(),
        "trial_state": module.state.to_dict(),
        EXTRAS_KEY: {**module.data_state(), "gradients": _pending_gradients(module)},
    }


def _pending_gradients(module: PayloadSource) -> list[list[torch.Tensor | None]] | None:
    """Gradients accumulated towards an optimizer step that has not happened yet."""
    ctx = module.context
    if module.state.batches_trained % context_setup(ctx).aggregation_frequency == 0:
        return None
    return [
        [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
        for model in ctx.models
    ]


def _restore_gradients(module: PayloadSource, grads: list[list[torch.Tensor | None]]) -> None:
    for model, model_grads in zip(module.context.models, grads, strict=True):
        for param, grad in zip(model.parameters(), model_grads, strict=True):
            param.grad = None if grad is None else grad.to(param.device)


def apply_payload(module: PayloadSource, payload: dict[str, Any]) -> None:
    """Load a `state_dict.pth` payload into the module's trial."""
    ctx = module.context
    extras = payload.get(EXTRAS_KEY) or {}
    visible = {k: v for k, v in payload.items() if k not in (EXTRAS_KEY, "trial_state")}
    for cb in module.trial_callbacks.values():
        cb.on_checkpoint_load_start(visible)
    load_models(ctx.models, payload)
    optimizers = entries(payload, "optimizer_state_dict", "optimizers_state_dict")
    check_count("optimizer", optimizers, ctx.optimizers)
    for opt, state in zip(ctx.optimizers, optimizers, strict=True):
        opt.load_state_dict(state)
    schedulers = entries(payload, "lr_scheduler", "lr_schedulers_state_dict")
    for sched, state in zip(ctx.lr_schedulers, schedulers, strict=False):
        sched.load_state_dict(state)
    scaler = _scaler(module)
    if "scaler_state_dict" in payload and scaler is not None:
        scaler.load_state_dict(payload["scaler_state_dict"])
    elif "scaler_state_dict" in payload or scaler is not None:
        logger.warning(
            "The checkpoint %s a gradient scaler state but the trial %s one; the scaler starts "
            "fresh.",
            "has" if scaler is None else "has no",
            "uses no" if scaler is None else "uses",
        )
    if "rng_state" in payload:
        restore_rng_state(payload["rng_state"])
    saved_callbacks = payload.get("callbacks", {}) or {}
    for name, cb in module.trial_callbacks.items():
        if name in saved_callbacks:
            cb.load_state_dict(saved_callbacks[name])
    if "trial_state" in payload:
        module.state = TrialState.from_dict(payload["trial_state"])
    grads = extras.get("gradients")
    if grads is not None:
        _restore_gradients(module, grads)


# Hooks promised a complete checkpoint: a trial implementing one waits for its saves.
WRITTEN_HOOKS = ("on_checkpoint_end", "on_checkpoint_write_end", "on_checkpoint_upload_end")


def observes_written_checkpoints(callbacks: Iterable[Any]) -> bool:
    """Whether a trial callback implements a hook that may read the written checkpoint."""
    return any(overrides(cb, hook) for cb in callbacks for hook in WRITTEN_HOOKS)


@dataclasses.dataclass
class PreparedSave:
    """A checkpoint's contents, taken while training is paused (the files come after)."""

    payload: dict[str, Any]
    trial_state: dict[str, int]
    load_data: dict[str, Any]
    # Further arguments of `write_checkpoint`: the code folder to copy, what to leave out.
    options: dict[str, Any]


def prepare_save(module: PayloadSource, entries: dict[str, Any] | None = None) -> PreparedSave:
    """Take a checkpoint's contents now, firing `on_checkpoint_save_start` (callbacks see, and
    may extend, exactly the entries Determined writes; the bridge's own entry and `entries`,
    e.g. the retention record, are added after them)."""
    state = module.state
    state.last_ckpt = state.batches_trained
    payload = trial_payload(module)
    payload.pop("trial_state")
    extras = payload.pop(EXTRAS_KEY)
    for cb in module.trial_callbacks.values():
        cb.on_checkpoint_save_start(payload)
    payload[EXTRAS_KEY] = {**extras, **(entries or {})}
    setup = context_setup(module.context)
    options: dict[str, Any] = {
        "code_dir": setup.code_dir,
        # What the run writes into its folder is output, not code.
        "code_exclude": tuple(
            setup.run_dir / d for d in ("tensorboard", "csv_logs", "lightning_logs")
        ),
        # A checkpoint is shared: the config's secrets stay out of its code/.
        "code_secrets": secret_values(
            checkpoint_configs(module.context)["experiment_config"] or {}
        ),
    }
    return PreparedSave(payload, state.to_dict(), _load_data(module), options)


def write_prepared(
    module: PayloadSource, base_dir: pathlib.Path, save: PreparedSave
) -> tuple[pathlib.Path, str]:
    """Write a prepared checkpoint under `base_dir/<uuid>` now, then fire the trial
    callbacks' `on_checkpoint_end` / `on_checkpoint_write_end`; returns its path and id."""
    final, storage_id = write_checkpoint(
        base_dir, save.payload, save.trial_state, save.load_data, **save.options
    )
    for cb in module.trial_callbacks.values():
        cb.on_checkpoint_end(str(final))
        cb.on_checkpoint_write_end(str(final))
    return final, storage_id


def save_checkpoint(
    module: PayloadSource, base_dir: pathlib.Path, entries: dict[str, Any] | None = None
) -> tuple[pathlib.Path, str]:
    """Checkpoint the trial under `base_dir/<uuid>` now, with the save hooks in Determined's
    order (the caller fires `on_checkpoint_upload_end`); returns its path and id."""
    return write_prepared(module, base_dir, prepare_save(module, entries))


def _load_data(module: PayloadSource) -> dict[str, Any]:
    cls = type(module.trial)
    configs = checkpoint_configs(module.context)
    if configs["experiment_config"] is not None:  # shared with the checkpoint: no secrets
        configs["experiment_config"] = redact_config(configs["experiment_config"])
    return {
        "trial_type": "PyTorchTrial",
        **configs,
        "trial_cls_spec": f"{cls.__module__}:{cls.__qualname__}",
        "is_trainer": True,
    }
