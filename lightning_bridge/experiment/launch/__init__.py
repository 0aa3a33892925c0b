"""Where a trial runs: one contract (`_contract`: the launcher, the handle it returns for a
started trial, `RunningTrial` for one already recorded), the registry that names the
launchers, the one pre-flight every command runs, and the launchers themselves: `local/`
(a process, a warm fork or torchrun on this machine) and `slurm/` (a job per trial)."""
