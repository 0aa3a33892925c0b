"""The `global_batch_size` hyperparameter split across the processes of a trial."""

from __future__ import annotations

from typing import Any

from lightning_bridge._errors import InvalidArgumentError


def split_batch_size(hparams: dict[str, Any] | None, slots: int) -> tuple[int | None, int | None]:
    """(per-slot, global) batch size from `global_batch_size`, or (None, None) without it.

    As in Determined, the global size must divide evenly across the `slots` processes.
    """
    if not hparams or hparams.get("global_batch_size") is None:
        return None, None
    global_bs = hparams["global_batch_size"]
    if isinstance(global_bs, bool) or not isinstance(global_bs, int) or global_bs < 1:
        raise InvalidArgumentError(
            f"The global_batch_size hyperparameter must be a positive int; got {global_bs!r}."
        )
    if global_bs % slots != 0:
        raise InvalidArgumentError(
            f"global_batch_size={global_bs} does not divide evenly across {slots} processes; "
            f"set it to a multiple of {slots}, e.g. {max(slots, global_bs - global_bs % slots)}"
        )
    return global_bs // slots, global_bs
