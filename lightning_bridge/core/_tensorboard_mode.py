"""`TensorboardMode`: who writes a trial's TensorBoard files (Determined's
`determined.core._tensorboard_mode`, an import path public code uses)."""

from __future__ import annotations

import enum


class TensorboardMode(enum.Enum):
    """AUTO: the chief writes reported metrics itself; MANUAL: the script writes and uploads."""

    AUTO = "AUTO"
    MANUAL = "MANUAL"
