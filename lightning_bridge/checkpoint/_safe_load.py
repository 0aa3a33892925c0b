"""Reading checkpoints safely: nothing in a checkpoint file runs as code.

`state_dict.pth` is loaded weights-only (tensors, containers, numbers and the numpy RNG state
Determined pickles); `trial_state.pkl` may hold only a dict of numbers. Anything else is
refused with a message, unless the caller opts in to full unpickling for a trusted file.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pathlib
import pickle
from typing import Any

import numpy as np
import torch

from lightning_bridge._errors import InvalidCheckpointError
from lightning_bridge.checkpoint._layout import FORMAT_VERSION, LEGACY_STATE_FILES
from lightning_bridge.checkpoint._state import TrialState

logger = logging.getLogger("lightning_bridge")


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
