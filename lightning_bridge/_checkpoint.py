"""Checkpoints in Determined's directory layout, written atomically and loaded safely.

A checkpoint is a directory holding `state_dict.pth` (models, optimizers, LR schedulers,
callbacks, RNG states), `trial_state.pkl` (progress counters), `load_data.json` (how to rebuild
the trial) and `metadata.json`. It is written to a temporary sibling directory, flushed to disk,
then renamed into place, so a reader never sees a partial checkpoint.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pathlib
import pickle
import random
import shutil
import uuid as uuid_lib
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import __version__
from ._amp import plugin_scaler
from ._errors import InvalidArgumentError, InvalidCheckpointError
from ._state import TrialState

if TYPE_CHECKING:
    from ._module import TrialModule

logger = logging.getLogger("lightning_bridge")

STATE_FILE = "state_dict.pth"
EXTRAS_KEY = "lightning_bridge"  # the bridge's own entry in state_dict.pth
LATEST_FILE = "latest"  # names the newest complete checkpoint in a checkpoint directory
FORMAT_VERSION = 1  # metadata.json "lightning_bridge_format"; bumped on incompatible changes
LEGACY_STATE_FILES = (
    ("state_dict.pth",),
    ("determined", "state_dict.pth"),
    ("pedl", "state_dict.pth"),
    ("checkpoint.pt",),
)


# ----- RNG state in a form `torch.load(weights_only=True)` accepts -----


def capture_rng_state() -> dict[str, Any]:
    """Every RNG the training loop draws from; numpy's key is stored as a tensor."""
    np_state: Any = np.random.get_state()
    state: dict[str, Any] = {
        "cpu_rng_state": torch.random.get_rng_state(),
        "np_rng_state": (
            str(np_state[0]),
            torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
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


# ----- payload <-> trial -----


def _scaler(module: TrialModule) -> Any:
    return module.context._scaler or plugin_scaler(module._trainer)


def trial_payload(module: TrialModule) -> dict[str, Any]:
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


def _pending_gradients(module: TrialModule) -> list[list[torch.Tensor | None]] | None:
    """Gradients accumulated towards an optimizer step that has not happened yet."""
    ctx = module.context
    if module.state.batches_trained % ctx._aggregation_frequency == 0:
        return None
    return [
        [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
        for model in ctx.models
    ]


def _restore_gradients(module: TrialModule, grads: list[list[torch.Tensor | None]]) -> None:
    for model, model_grads in zip(module.context.models, grads, strict=True):
        for param, grad in zip(model.parameters(), model_grads, strict=True):
            param.grad = None if grad is None else grad.to(param.device)


def _entries(payload: dict[str, Any], single: str, many: str) -> list[Any]:
    """A payload's per-object states, from the current (list) or the older (single) key."""
    return [payload[single]] if single in payload else list(payload.get(many, []))


def _check_count(what: str, states: list[Any], objects: list[Any]) -> None:
    if len(states) != len(objects):
        raise InvalidCheckpointError(
            f"The checkpoint holds {len(states)} {what}(s) but the trial wraps {len(objects)}; "
            "load it into the trial class that wrote it."
        )


def load_models(models: list[torch.nn.Module], payload: dict[str, Any]) -> None:
    """Load a payload's model states (current or older keys), naming any misfit clearly."""
    states = _entries(payload, "model_state_dict", "models_state_dict")
    _check_count("model", states, models)
    for idx, (model, state) in enumerate(zip(models, states, strict=True)):
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            # A checkpoint written from a DDP-wrapped model carries a "module." prefix.
            unprefixed = dict(state)
            torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(
                unprefixed,
                "module.",
            )
            try:
                model.load_state_dict(unprefixed)
            except RuntimeError:
                raise InvalidCheckpointError(
                    f"The checkpoint's model {idx} does not fit the trial's model {idx} "
                    f"({type(model).__name__}): {exc}"
                ) from None


def apply_payload(module: TrialModule, payload: dict[str, Any]) -> None:
    """Load a `state_dict.pth` payload into the module's trial."""
    ctx = module.context
    extras = payload.get(EXTRAS_KEY) or {}
    visible = {k: v for k, v in payload.items() if k not in (EXTRAS_KEY, "trial_state")}
    for cb in module.trial_callbacks.values():
        cb.on_checkpoint_load_start(visible)
    load_models(ctx.models, payload)
    optimizers = _entries(payload, "optimizer_state_dict", "optimizers_state_dict")
    _check_count("optimizer", optimizers, ctx.optimizers)
    for opt, state in zip(ctx.optimizers, optimizers, strict=True):
        opt.load_state_dict(state)
    schedulers = _entries(payload, "lr_scheduler", "lr_schedulers_state_dict")
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


# ----- writing -----


def _fsync_tree(root: pathlib.Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(root)


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_latest(base_dir: pathlib.Path, storage_id: str) -> None:
    """Point `latest` at a complete checkpoint (written beside, then renamed over)."""
    tmp = base_dir / f".{LATEST_FILE}.{storage_id}"
    with open(tmp, "w") as f:
        f.write(storage_id + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, base_dir / LATEST_FILE)
    _fsync_dir(base_dir)


def resolve_checkpoint(
    value: str | os.PathLike[str], ckpt_dir: pathlib.Path, option: str = "latest_checkpoint"
) -> pathlib.Path:
    """A checkpoint given as a directory path, a checkpoint id under the checkpoint dir, or
    "latest" (the newest complete checkpoint there). `option` names the argument in the
    message when there is no checkpoint yet."""
    path = pathlib.Path(value)
    if str(value) == LATEST_FILE and not path.is_dir():
        latest = latest_checkpoint_in(ckpt_dir)
        if latest is None:
            raise InvalidArgumentError(
                f"{option}='latest' but {ckpt_dir} holds no checkpoint yet; train without "
                f"{option} first."
            )
        return latest
    if not path.is_dir() and (ckpt_dir / path).is_dir():
        return ckpt_dir / path
    return path


def latest_checkpoint_in(base_dir: pathlib.Path) -> pathlib.Path | None:
    """The checkpoint to continue from in a checkpoint directory, if any.

    `latest` names the last checkpoint written. If a save was interrupted after its directory
    was renamed into place but before `latest` existed, the complete checkpoint with the most
    batches trained is used instead.
    """
    pointer = base_dir / LATEST_FILE
    if pointer.is_file():
        named = base_dir / pointer.read_text().strip()
        if (named / "metadata.json").is_file():
            return named

    def steps(path: pathlib.Path) -> int:
        try:
            return int(json.loads((path / "metadata.json").read_text())["steps_completed"])
        except (OSError, ValueError, KeyError, TypeError):
            return -1

    complete = [
        p
        for p in (base_dir.iterdir() if base_dir.is_dir() else [])
        if p.is_dir() and not p.name.startswith(".") and steps(p) >= 0
    ]
    return max(complete, key=steps) if complete else None


def remove_partial_checkpoints(base_dir: pathlib.Path) -> None:
    """Delete what an interrupted save left behind (never a complete checkpoint)."""
    if base_dir.is_dir():
        for leftover in base_dir.glob(".*.partial"):
            shutil.rmtree(leftover, ignore_errors=True)


def save_checkpoint(module: TrialModule, base_dir: pathlib.Path) -> tuple[pathlib.Path, str]:
    """Write the trial's checkpoint under `base_dir/<uuid>`; returns its path and id.

    Fires the trial callbacks' save and write hooks in Determined's order (the caller fires
    `on_checkpoint_upload_end` on every process once the id is shared).
    """
    state = module.state
    state.last_ckpt = state.batches_trained
    payload = trial_payload(module)
    payload.pop("trial_state")
    # Callbacks see (and may extend) exactly the entries Determined writes; the bridge's own
    # entry is added after them.
    extras = payload.pop(EXTRAS_KEY)
    for cb in module.trial_callbacks.values():
        cb.on_checkpoint_save_start(payload)
    payload[EXTRAS_KEY] = extras
    storage_id = str(uuid_lib.uuid4())
    base_dir.mkdir(parents=True, exist_ok=True)
    final = base_dir / storage_id
    tmp = base_dir / f".{storage_id}.partial"
    tmp.mkdir()
    try:
        torch.save(payload, tmp / STATE_FILE)
        with open(tmp / "trial_state.pkl", "wb") as f:
            pickle.dump(state.to_dict(), f)
        with open(tmp / "load_data.json", "w") as f:
            json.dump(_load_data(module), f)
        with open(tmp / "metadata.json", "w") as f:
            json.dump(
                {
                    "lightning_bridge_version": __version__,
                    "steps_completed": state.batches_trained,
                    "framework": f"torch-{torch.__version__}",
                    "format": "pickle",
                    "lightning_bridge_format": FORMAT_VERSION,
                },
                f,
                indent=2,
            )
        _fsync_tree(tmp)
        os.replace(tmp, final)
        _fsync_dir(base_dir)
        _write_latest(base_dir, storage_id)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("Checkpoint %s written to %s", storage_id, final)
    for cb in module.trial_callbacks.values():
        cb.on_checkpoint_end(str(final))
        cb.on_checkpoint_write_end(str(final))
    return final, storage_id


def _load_data(module: TrialModule) -> dict[str, Any]:
    ctx = module.context
    cls = type(module.trial)
    return {
        "trial_type": "PyTorchTrial",
        "experiment_config": ctx._exp_conf if ctx._hparams is not None else None,
        "hparams": ctx._hparams if ctx._exp_conf is not None else None,
        "trial_cls_spec": f"{cls.__module__}:{cls.__qualname__}",
        "is_trainer": True,
    }


# ----- reading -----


class _StateUnpickler(pickle.Unpickler):
    """Reads `trial_state.pkl` (a dict of ints) and refuses any other global."""

    def find_class(self, module: str, name: str) -> Any:
        raise InvalidCheckpointError(
            f"trial_state.pkl refers to {module}.{name}; a trial state holds only numbers, so "
            "the file is not a trial state (or was tampered with)."
        )


def read_trial_state(path: pathlib.Path) -> TrialState | None:
    file = path / "trial_state.pkl"
    if not file.exists():
        return None
    try:
        data = _StateUnpickler(io.BytesIO(file.read_bytes())).load()
    except InvalidCheckpointError:
        raise
    except Exception as exc:
        raise InvalidCheckpointError(f"{file} is not a readable trial state: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidCheckpointError(f"{file} does not hold a trial state dict.")
    return TrialState.from_dict(data)


def _numpy_rng_globals() -> list[Any]:
    """The numpy types a Determined checkpoint pickles for its RNG state (and nothing else)."""
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _check_metadata(path: pathlib.Path) -> None:
    file = path / "metadata.json"
    if not file.is_file():
        return
    try:
        metadata = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidCheckpointError(f"{file} is not valid JSON: {exc}") from None
    fmt = metadata.get("format", "pickle")
    if fmt != "pickle":
        raise InvalidCheckpointError(
            f"{path} has checkpoint format {fmt!r}; lightning_bridge reads the 'pickle' format "
            "of PyTorch trials only."
        )
    version = metadata.get("lightning_bridge_format", FORMAT_VERSION)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise InvalidCheckpointError(
            f"{path} was written in lightning_bridge checkpoint format {version!r}, newer than "
            f"this version reads ({FORMAT_VERSION}); upgrade lightning_bridge to load it."
        )


def load_state_file(
    path: pathlib.Path,
    *,
    trusted: bool = False,
    torch_load_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `state_dict.pth` payload of a checkpoint directory.

    Loaded weights-only: tensors, containers and the numpy RNG state Determined pickles, nothing
    that could run code. `trusted=True` (or `torch_load_kwargs={"weights_only": False}`) loads
    arbitrary pickles from files you trust, such as old checkpoints with custom objects.
    """
    if not path.is_dir():
        raise InvalidCheckpointError(
            f"Checkpoint directory {path} does not exist; pass the directory a previous run "
            "logged as 'Checkpoint ... written to ...'."
        )
    for parts in LEGACY_STATE_FILES:
        file = path.joinpath(*parts)
        if file.exists():
            break
    else:
        raise InvalidCheckpointError(
            f"{path} is not a checkpoint: it holds no state_dict.pth (nor an older "
            "determined/state_dict.pth, pedl/state_dict.pth or checkpoint.pt)."
        )
    _check_metadata(path)
    kwargs: dict[str, Any] = {"map_location": "cpu", "weights_only": True}
    kwargs.update(torch_load_kwargs or {})
    if trusted:
        kwargs["weights_only"] = False
    try:
        if kwargs["weights_only"]:
            with torch.serialization.safe_globals(_numpy_rng_globals()):
                payload = torch.load(file, **kwargs)
        else:
            logger.warning("Loading %s with full unpickling: only do this for trusted files.", file)
            payload = torch.load(file, **kwargs)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" not in str(exc):
            raise InvalidCheckpointError(
                f"{file} could not be loaded ({str(exc)[:300]}); it is truncated or corrupt. "
                "Use an earlier checkpoint."
            ) from None
        raise InvalidCheckpointError(
            f"{file} holds objects outside the safe set (tensors, containers, numbers, numpy RNG "
            f"state), so it was not loaded and nothing in it ran: {str(exc).splitlines()[-1][:300]}"
            " If you wrote this file and trust it, load it with trusted=True."
        ) from None
    except Exception as exc:
        raise InvalidCheckpointError(
            f"{file} could not be loaded ({type(exc).__name__}: {str(exc)[:300]}); it is "
            "truncated or corrupt. Use an earlier checkpoint."
        ) from None
    if not isinstance(payload, dict):
        raise InvalidCheckpointError(f"{file} does not hold a checkpoint dict.")
    return payload


def read_checkpoint(
    directory: str | os.PathLike[str], *, trusted: bool = False
) -> tuple[dict[str, Any], TrialState | None]:
    """The `state_dict.pth` payload and trial state of a checkpoint directory, read safely."""
    path = pathlib.Path(directory)
    return load_state_file(path, trusted=trusted), read_trial_state(path)
