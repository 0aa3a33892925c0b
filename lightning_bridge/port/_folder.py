"""What a ported trial folder is made of: its file names and what inspection found.

Shared by inspection (`_inspect`), rendering (`_render`), source copying (`_sources`) and the
writer (`_write`), so none of them imports another for these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_EPOCHS = 10
EXPERIMENT_SEED = 0
MODEL_DEF = "model_def.py"
CONST_YAML = "const.yaml"
STARTUP_HOOK = "startup-hook.sh"


@dataclass
class Loaded:
    """A class named on the command line, with the module it was imported from."""

    spec: str
    cls: type
    module: Any

    @property
    def module_name(self) -> str:
        return str(self.module.__name__)

    @property
    def qualname(self) -> str:
        return self.spec.split(":", 1)[1]


@dataclass
class Hyperparameters:
    """Constructor defaults that become hyperparameters, the batch size, what was skipped, and
    the arguments without a default (written as null, for the user to fill)."""

    values: dict[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    skipped: list[str] = field(default_factory=list)
    to_fill: list[str] = field(default_factory=list)


@dataclass
class Searcher:
    """What the searcher and checkpoints are set to, and how it was found."""

    metric: str
    smaller_is_better: bool
    # "validation", "training" (a module without validation_step), "checkpoint" (from
    # ModelCheckpoint), or "source" (read from the code: the module could not be built).
    found_by: str
    checkpoint_policy: str | None = None
