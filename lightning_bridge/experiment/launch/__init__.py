"""Where a trial runs: one contract (`_contract`: the launcher, the handle it returns for a
started trial, `RunningTrial` for one already recorded), the registry that names the
launchers (`_registry`), the one pre-flight every command runs, and the launchers themselves:
`local/` (a process, a warm fork or torchrun on this machine), `slurm/` (a job per trial, or
a search's worker jobs) and `ray/` (actors placed on a Ray cluster)."""

# The launchers' names, as `run --launcher` and an experiment's record give them; light, so
# that the command line's parser names them without importing a launcher.
LAUNCHERS = ("local", "slurm", "ray")
