"""`lightning_bridge.experiment._cli:command`: the entry point console scripts installed by
earlier versions name. It runs the command line (`lightning_bridge.experiment.cli`)."""

# forwarding module: `lightning-bridge` scripts installed before name this path.
from __future__ import annotations

from lightning_bridge.experiment.cli._main import command, main

__all__ = ["command", "main"]
