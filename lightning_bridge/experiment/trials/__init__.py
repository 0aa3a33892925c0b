"""An experiment's trials: running one and recording it (`_trial_runs`), its checkpoints and
the one a new trial starts from (`_source_checkpoint`), a search's storage as a trial meets
it, and the summary printed when an experiment ends."""
