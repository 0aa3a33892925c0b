"""`lightning_bridge.experiment._cli:command`: the entry point that `lightning-bridge` console
scripts generated before the commands moved to `experiment/cli/` name (an editable install
made then keeps its script until it is reinstalled). It runs the command line
(`lightning_bridge.experiment.cli`), the entry point `[project.scripts]` names now.

It may go with the first release: no released version installed a script that names it.
"""

# forwarding module: `lightning-bridge` scripts installed before name this path.
from __future__ import annotations

from lightning_bridge.experiment.cli._main import command, main

__all__ = ["command", "main"]
