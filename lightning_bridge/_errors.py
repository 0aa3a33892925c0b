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


class WorkspaceError(InvalidArgumentError):
    """The workspace cannot hold the record (read-only, or its registry file is damaged)."""


class InvalidCheckpointError(BridgeError, ValueError):
    """A checkpoint directory is missing, incomplete, corrupt or does not fit the trial."""


# Where Determined reports the same mistake with a built-in exception, the bridge's error is an
# instance of that built-in too, so `except RuntimeError:` written for Determined still catches it.


class TrialRuntimeError(InvalidTrialError, RuntimeError):
    """A trial problem Determined raises as `RuntimeError` (empty validation data, a missing or
    non-scalar searcher metric, a plain torch DataLoader without disabled repro checks)."""


class TrialTypeError(InvalidTrialError, TypeError):
    """A trial problem Determined raises as `TypeError` (a non-dict validation result, a
    non-trial passed to the Trainer, a wrong LR scheduler step mode)."""


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type where Determined raises `TypeError` (`max_length`)."""


class CheckpointRuntimeError(InvalidCheckpointError, RuntimeError):
    """A checkpoint that does not fit the trial, where Determined raises `RuntimeError`."""


class CheckpointWriteError(BridgeError):
    """A checkpoint could not be written (full disk, read-only or missing directory, ...);
    the checkpoints written before it are intact."""


class InvalidHP(Exception):
    """Raised by trial code when its hyperparameters cannot train (e.g. a model too large).

    The trial ends without counting as an error; a hyperparameter search replaces it with a new
    configuration where Determined's searcher does (random and adaptive_asha). `msg` must be a
    string, as in Determined.
    """

    def __init__(self, msg: str = "...") -> None:
        if not isinstance(msg, str):
            raise TypeError(
                f"InvalidHP takes a message string, not {type(msg).__name__}: "
                "raise InvalidHP('why these hyperparameters cannot train')"
            )
        super().__init__(msg)
        self.msg = msg


def is_invalid_hp(exc: BaseException) -> bool:
    """Whether `exc` is the bridge's InvalidHP or Determined's `determined.InvalidHP` (matched
    by name, so trial code importing a real Determined is recognised without importing it)."""
    if isinstance(exc, InvalidHP):
        return True
    return any(
        cls.__name__ == "InvalidHP"
        and (cls.__module__ == "determined" or cls.__module__.startswith("determined."))
        for cls in type(exc).__mro__
    )
