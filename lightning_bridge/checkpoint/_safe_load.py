"""Reading checkpoints safely: nothing in a checkpoint file runs as code.

`state_dict.pth` is loaded weights-only (tensors, containers, numbers and the numpy RNG state
Determined pickles, under numpy 1's and numpy 2's names); `trial_state.pkl` (or the
`workload_sequencer.pkl` of Determined < 0.21) may hold only a dict of numbers. Anything else is
refused with a message naming the caller's opt-in to full unpickling for a trusted file
(`trust_hint`: `trusted=True`, `fit(..., trust_checkpoint=True)`, `--trust-checkpoint`).
"""

from __future__ import annotations

import io
import json
import logging
import os
import pathlib
import pickle
from typing import Any

import torch

from lightning_bridge._errors import InvalidCheckpointError
from lightning_bridge.checkpoint._allowlist import numpy_safe_globals
from lightning_bridge.checkpoint._layout import FORMAT_VERSION, LEGACY_STATE_FILES, TrialState

logger = logging.getLogger("lightning_bridge")


class _StateUnpickler(pickle.Unpickler):
    """Reads `trial_state.pkl` (a dict of ints) and refuses any other global."""

    def __init__(self, file: Any, name: str, trust_hint: str) -> None:
        super().__init__(file)
        self._name = name
        self._trust_hint = trust_hint

    def find_class(self, module: str, name: str) -> Any:
        raise InvalidCheckpointError(
            f"{self._name} refers to {module}.{name}; a trial state holds only numbers, so "
            "the file is not a trial state (or was tampered with). Nothing in it ran. If you "
            f"wrote this file and trust it, load it with {self._trust_hint}."
        )


# Progress counters: `trial_state.pkl` since Determined 0.21; before, `workload_sequencer.pkl`
# with the batch count under `steps_completed` (0.18 - 0.20) or `latest_batch` (0.17).
STATE_FILES = ("trial_state.pkl", "workload_sequencer.pkl")


def read_trial_state(
    path: pathlib.Path, *, trusted: bool = False, trust_hint: str = "trusted=True"
) -> TrialState | None:
    """The checkpoint's progress counters, or None when it has none.

    A legacy `workload_sequencer.pkl` gives `epochs_trained=-1`: its epoch count depends on the
    epoch length, which the trainer fills in once the training data is built.
    """
    file = next((path / n for n in STATE_FILES if (path / n).exists()), None)
    if file is None:
        return None
    try:
        raw = file.read_bytes()
        if trusted:
            data = pickle.loads(raw)
        else:
            data = _StateUnpickler(io.BytesIO(raw), file.name, trust_hint).load()
    except InvalidCheckpointError:
        raise
    except Exception as exc:
        raise InvalidCheckpointError(f"{file} is not a readable trial state: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidCheckpointError(f"{file} does not hold a trial state dict.")
    if file.name == "workload_sequencer.pkl":
        batches = data.get("steps_completed", data.get("latest_batch"))
        data = {**data, "batches_trained": batches or 0, "epochs_trained": -1}
    try:
        return TrialState.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise InvalidCheckpointError(f"{file} holds a malformed trial state: {exc}") from None


# Checkpoint formats Determined wrote for PyTorch trials: "pickle" since 0.14; "cloudpickle"
# before (a `torch.save` of state dicts, loadable weights-only, or of whole objects, which is not).
_FORMATS = ("pickle", "cloudpickle")


def read_metadata(path: pathlib.Path) -> dict[str, Any]:
    """`metadata.json` of a checkpoint directory ({} when it has none)."""
    file = path / "metadata.json"
    if not file.is_file():
        return {}
    try:
        metadata = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidCheckpointError(f"{file} is not valid JSON: {exc}") from None
    if not isinstance(metadata, dict):
        raise InvalidCheckpointError(f"{file} does not hold a JSON object.")
    return metadata


def _check_metadata(path: pathlib.Path, metadata: dict[str, Any]) -> None:
    fmt = metadata.get("format", "pickle")
    if fmt not in _FORMATS:
        raise InvalidCheckpointError(
            f"{path} has checkpoint format {fmt!r}; lightning_bridge reads the 'pickle' and "
            "'cloudpickle' formats of PyTorch trials only."
        )
    version = metadata.get("lightning_bridge_format", FORMAT_VERSION)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise InvalidCheckpointError(
            f"{path} was written in lightning_bridge checkpoint format {version!r}, newer than "
            f"this version reads ({FORMAT_VERSION}); upgrade lightning_bridge to load it."
        )


def state_file(path: pathlib.Path) -> pathlib.Path:
    """The payload file of a checkpoint directory, in any layout Determined wrote."""
    if not path.is_dir():
        raise InvalidCheckpointError(
            f"Checkpoint directory {path} does not exist; pass the directory a previous run "
            "logged as 'Checkpoint ... written to ...'."
        )
    for parts in LEGACY_STATE_FILES:
        file = path.joinpath(*parts)
        if file.exists():
            return file
    raise InvalidCheckpointError(
        f"{path} is not a checkpoint: it holds no state_dict.pth (nor an older "
        "determined/state_dict.pth, pedl/state_dict.pth or checkpoint.pt)."
    )


def _refused_global(exc: Exception) -> str:
    """The line of torch's weights-only refusal that names the global."""
    lines = [line.strip() for line in str(exc).splitlines() if "GLOBAL" in line]
    return (lines[0] if lines else str(exc).splitlines()[-1])[:300]


def load_state_file(
    path: pathlib.Path,
    *,
    trusted: bool = False,
    torch_load_kwargs: dict[str, Any] | None = None,
    trust_hint: str = "trusted=True",
    name: str | None = None,
) -> dict[str, Any]:
    """The `state_dict.pth` payload of a checkpoint directory (or its file `name`: one
    process's part of a sharded checkpoint).

    Loaded weights-only: tensors, containers and the numpy RNG state Determined pickles, nothing
    that could run code. `trusted=True` (or `torch_load_kwargs={"weights_only": False}`) loads
    arbitrary pickles from files you trust, such as old checkpoints with custom objects;
    `trust_hint` is how the caller's user asks for that, named in the refusal.
    """
    file = state_file(path) if name is None else path / name
    if not file.is_file():
        raise InvalidCheckpointError(
            f"{path} holds no {name}: it is not a checkpoint of this trial type, or it was "
            "written by fewer processes than this run has (run with as many processes)."
        )
    metadata = read_metadata(path)
    _check_metadata(path, metadata)
    kwargs: dict[str, Any] = {"map_location": "cpu", "weights_only": True}
    kwargs.update(torch_load_kwargs or {})
    if trusted:
        kwargs["weights_only"] = False
    try:
        if kwargs["weights_only"]:
            with torch.serialization.safe_globals(numpy_safe_globals()):
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
        what = "holds objects outside the safe set (tensors, containers, numbers, numpy arrays)"
        if metadata.get("format") == "cloudpickle":
            what = (
                "is a pre-0.14 Determined 'cloudpickle' checkpoint holding pickled Python "
                "objects (not only state dicts); loading it would run code from the file"
            )
        raise InvalidCheckpointError(
            f"{file} {what}, so it was not loaded and nothing in it ran ({_refused_global(exc)})."
            f" If you wrote this file and trust it, load it with {trust_hint}."
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
    directory: str | os.PathLike[str], *, trusted: bool = False, trust_hint: str = "trusted=True"
) -> tuple[dict[str, Any], TrialState | None]:
    """The `state_dict.pth` payload and trial state of a checkpoint directory, read safely."""
    path = pathlib.Path(directory)
    payload = load_state_file(path, trusted=trusted, trust_hint=trust_hint)
    return payload, read_trial_state(path, trusted=trusted, trust_hint=trust_hint)
