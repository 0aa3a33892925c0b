"""The per-object entries of a checkpoint payload, and loading model weights from them.

Payloads written by the bridge and by recent Determined versions hold lists
(`models_state_dict`, ...); older Determined versions wrote one object (`model_state_dict`).
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_bridge._errors import CheckpointRuntimeError


def entries(payload: dict[str, Any], single: str, many: str) -> list[Any]:
    """A payload's per-object states, from the current (list) or the older (single) key."""
    return [payload[single]] if single in payload else list(payload.get(many, []))


def check_count(what: str, states: list[Any], objects: list[Any]) -> None:
    if len(states) != len(objects):
        # Determined raises RuntimeError here.
        raise CheckpointRuntimeError(
            f"The checkpoint holds {len(states)} {what}(s) but the trial wraps {len(objects)}; "
            "load it into the trial class that wrote it."
        )


def load_models(models: list[torch.nn.Module], payload: dict[str, Any]) -> None:
    """Load a payload's model states (current or older keys), naming any misfit clearly."""
    states = entries(payload, "model_state_dict", "models_state_dict")
    check_count("model", states, models)
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
                # Determined lets torch's RuntimeError through: `except RuntimeError` catches it.
                raise CheckpointRuntimeError(
                    f"The checkpoint's model {idx} does not fit the trial's model {idx} "
                    f"({type(model).__name__}): {exc}"
                ) from None
