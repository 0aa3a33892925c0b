"""The globals a weights-only load of `state_dict.pth` may resolve, under every numpy's names.

Determined pickles numpy's RNG state (and callbacks may keep numpy scalars), so a checkpoint
refers to numpy's array rebuilders by module path. numpy 2 writes `numpy._core.multiarray...`;
numpy 1.x wrote `numpy.core.multiarray...`, the names every checkpoint of Determined <= 0.38
run under numpy 1 holds. Both names are mapped to the running numpy's functions: they build
arrays and scalars from raw bytes and call nothing else, so nothing in the file runs as code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The numeric dtypes whose instances a pickle may rebuild (bool, integers, floats, complex).
_DTYPE_CODES = "?bhilqBHILQefdgFDG"


def _multiarray() -> Any:
    core = getattr(np, "_core", None)
    return core.multiarray if core is not None else np.core.multiarray  # type: ignore[attr-defined]


def numpy_safe_globals() -> list[Any]:
    """`torch.serialization.safe_globals` entries for numpy arrays, dtypes and scalars."""
    multiarray = _multiarray()
    entries: list[Any] = [np.ndarray, np.dtype]
    entries += list({type(np.dtype(code)) for code in _DTYPE_CODES})
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        entries.append((multiarray._reconstruct, f"{module}._reconstruct"))
        entries.append((multiarray.scalar, f"{module}.scalar"))
    return entries
