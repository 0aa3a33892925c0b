"""One log format for everything a run prints: the bridge's records and Lightning's.

`configure()` sends the `lightning_bridge` logger to stderr as `lightning-bridge: LEVEL:
message` and, for a run of the `lightning-bridge` command, also to the trial's log file with a
timestamp and the logger's name. `adopt_lightning()` routes Lightning's loggers through the same
handlers (instead of Lightning's own) once Lightning is imported, and drops Lightning's
advertising "Tip" lines, which say nothing about the run.
"""

from __future__ import annotations

import logging
import os
import pathlib
import sys

CONSOLE_FORMAT = "lightning-bridge: %(levelname)s: %(message)s"
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
BRIDGE = "lightning_bridge"
_LIGHTNING = ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning")
# The loggers Lightning's rank-zero messages are emitted from.
_RANK_ZERO = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _Stderr(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time of the record (tests capture it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.partition(".")[0] == BRIDGE and _printed_by_root():
            return  # the script's own `logging.basicConfig(...)` prints it, in its format
        self.stream = sys.stderr
        super().emit(record)


def _printed_by_root() -> bool:
    """Whether the root logger has a handler of the user's printing to the console (a script's
    `logging.basicConfig(format=det.LOG_FORMAT)`), which the bridge's records propagate to."""
    consoles = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
    return logging.getLogger(BRIDGE).propagate and any(
        type(h) is logging.StreamHandler and h.stream in consoles
        for h in logging.getLogger().handlers
    )


class _TrialLog(logging.FileHandler):
    """The trial's log file (appended to: a continued trial keeps one log)."""


class DropAdvertising(logging.Filter):
    """Drops Lightning's "Tip: try installing ..." lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip:" not in str(record.msg)


def _handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger(BRIDGE).handlers if isinstance(h, (_Stderr, _TrialLog))]


def configure(log_file: str | os.PathLike[str] | None = None) -> None:
    """Send the bridge's records to stderr (and to `log_file`, replacing an earlier one)."""
    bridge = logging.getLogger(BRIDGE)
    bridge.setLevel(logging.INFO)
    if not any(isinstance(h, _Stderr) for h in bridge.handlers):
        console = _Stderr()
        console.setFormatter(logging.Formatter(CONSOLE_FORMAT))
        # On the handler, so it holds whichever of Lightning's loggers a Tip comes from.
        console.addFilter(DropAdvertising())
        bridge.addHandler(console)
    for old in [h for h in bridge.handlers if isinstance(h, _TrialLog)]:
        if log_file is not None and pathlib.Path(old.baseFilename) == pathlib.Path(log_file):
            log_file = None  # already there
            continue
        bridge.removeHandler(old)
        old.close()
    if log_file is not None:
        pathlib.Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        file = _TrialLog(log_file, encoding="utf-8")
        file.setFormatter(logging.Formatter(FILE_FORMAT))
        file.addFilter(DropAdvertising())
        bridge.addHandler(file)
    adopt_lightning()


def close_log_file() -> None:
    """Stop writing the trial's log file (the run ended)."""
    bridge = logging.getLogger(BRIDGE)
    for old in [h for h in bridge.handlers if isinstance(h, _TrialLog)]:
        bridge.removeHandler(old)
        old.close()
    adopt_lightning()


def adopt_lightning() -> None:
    """Drop Lightning's advertising; when the bridge's handlers are configured, Lightning's
    loggers write through them instead of through their own. Does nothing to a logger of a
    Lightning that is not imported yet."""
    for name in _RANK_ZERO:
        if name in logging.Logger.manager.loggerDict:
            logger = logging.getLogger(name)
            if not any(isinstance(f, DropAdvertising) for f in logger.filters):
                logger.addFilter(DropAdvertising())
    handlers = _handlers()
    if not handlers:
        return
    for name in _LIGHTNING:
        if name not in sys.modules:
            continue
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        if name in ("lightning", "pytorch_lightning"):
            for handler in handlers:
                logger.addHandler(handler)
            logger.propagate = False
        else:
            logger.propagate = True  # to "lightning", which writes through the handlers
