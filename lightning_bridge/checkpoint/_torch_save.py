"""`save_state`: `torch.save` without the per-record CRC32 that loading never checks.

`torch.save` computes a CRC32 over every record it writes (every tensor's bytes), which costs
more than writing them; `torch.load` never verifies it (torch builds its zip reader with
`MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS`, so a flipped byte loads silently either way), and the
file stays a valid torch checkpoint that every loader reads. Only zip tools that test
archives (`unzip -t`) notice the missing checksums. torch switches the CRC with a process-wide
setting read when a save opens its file; it is switched off around this save only (saves here
are serialized by a lock) and restored afterwards.
"""

from __future__ import annotations

import os
import threading
from typing import IO, Any

import torch

_LOCK = threading.Lock()


def save_state(obj: Any, path: str | os.PathLike[str] | IO[bytes]) -> None:
    """`torch.save(obj, path)` (a path or a binary file) without per-record CRC32s (see the
    module docstring)."""
    serialization: Any = torch.serialization
    if not hasattr(serialization, "set_crc32_options"):  # torch without the switch
        torch.save(obj, path)
        return
    with _LOCK:
        previous = serialization.get_crc32_options()
        serialization.set_crc32_options(False)
        try:
            torch.save(obj, path)
        finally:
            serialization.set_crc32_options(previous)
