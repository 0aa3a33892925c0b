"""What Determined's experiment YAML means: the config model (pydantic, one message per bad
key), its schema sections (`slurm:` included), the `entrypoint` it names, and what a config
becomes before anything runs (`_plan`: the command's `Options`, the validated `Plan`, a
`TrialRun`)."""
