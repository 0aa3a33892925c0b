"""What runs inside a trial's process: the plan of a run and the run description it writes
(`_plan`), the trial's process itself (`_child`), the startup hook, `torchrun` under the
bridge's stop handling, the one signal scope, the exit codes, and the link to a search worker
that started the process (`_parent`)."""
