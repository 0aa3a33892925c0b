"""Experiments: the `lightning-bridge` command and what it runs, in rooms each importing only
the ones below it (lint-imports keeps the order; docs/cluster.md has the table): `cli/` (the
commands), `searches/` (running a search's trials), `launch/` (where a trial runs),
`trial_process/` (inside a trial's process), `trials/` (a trial of the record: started,
continued, its checkpoints and working copy), `config/` (what a config means and becomes).
The modules here beside them are the stable `python -m` names job scripts call.
"""
