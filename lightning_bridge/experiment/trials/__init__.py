"""An experiment's trials in the record: started and continued by the commands, with the checks
before anything trains (`_experiments`), their checkpoints (fetched, settled, retention) and
the one a new trial starts from (`_source_checkpoint`), and a search trial's working copy of
the experiment folder (`_workdir`)."""
