"""`TrialState`: the trial's progress counters, saved as `trial_state.pkl` in checkpoints."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class TrialState:
    """Batches and epochs trained, and the batch counts of the last checkpoint and validation."""

    trial_id: int = 0
    last_ckpt: int = 0
    step_id: int = 0
    last_val: int = 0
    batches_trained: int = 0
    epochs_trained: int = 0

    @property
    def checkpoint_is_current(self) -> bool:
        return self.last_ckpt == self.batches_trained

    @property
    def validation_is_current(self) -> bool:
        return self.last_val == self.batches_trained

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialState:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in fields and v is not None})
