"""lightning-bridge's commands: argv -> one pre-flight -> the layers below; exit codes.

`command` is the console script's entry point (`[project.scripts]`), a stable name while the
modules behind it move: `_main` dispatches, `_parser` reads argv, `_search_commands` starts,
joins and continues a search, `_record_commands` and `_model_commands` answer from the
experiment record and the model registry, `_summary` prints their tables and a run's end,
`_plot` draws.
"""

from lightning_bridge.experiment.cli._main import command

__all__ = ["command"]
