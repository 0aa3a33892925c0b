"""Error types the bridge raises for bad input.

Every check that can fail because of user input raises one of these with a message that says
what is wrong and how to fix it. `Trainer.fit` re-raises them without Lightning's frames so the
user sees the message, not the engine's call stack.
"""

from __future__ import annotations


class BridgeError(Exception):
    """Base class of the errors that report a problem in user input."""


class InvalidTrialError(BridgeError, ValueError):
    """The trial class, its return values or its use of the context break the trial contract."""


class InvalidArgumentError(BridgeError, ValueError):
    """An argument to `init`, `Trainer` or `Trainer.fit` is malformed."""


class InvalidCheckpointError(BridgeError, ValueError):
    """A checkpoint directory is missing, incomplete, corrupt or does not fit the trial."""


class CheckpointWriteError(BridgeError):
    """A checkpoint could not be written (full disk, read-only or missing directory, ...);
    the checkpoints written before it are intact."""
