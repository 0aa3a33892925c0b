"""Where a trial runs: one contract (`_contract`: the launcher, its default run of a single
trial; `_handle`: the one handle a launcher returns for a started trial and the loop that
follows it; `RunningTrial` for one already recorded), the registry that names the launchers
(`_registry`), the one pre-flight every command runs (`_preflight`), the warm process a
search's trials are forked from (`_warm`), and the launchers themselves: `local/` (a process,
a warm fork or torchrun on this machine), `slurm/` (a job per trial, or a search's worker
jobs) and `ray/` (actors placed on a Ray cluster)."""

# The launchers' names, as `run --launcher` and an experiment's record give them; light, so
# that the command line's parser names them without importing a launcher.
LAUNCHERS = ("local", "slurm", "ray")
