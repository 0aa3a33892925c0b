"""What runs inside a trial's process: the trial run to its end from its run description
(`_run`), one trial of a plan run here and the run description it writes (`_execute`), a
script entrypoint as a child (`_child`), the startup hook, `torchrun` under the bridge's stop
handling, the one signal scope, the exit codes, and the link to a search worker that started
the process (`_parent`)."""
