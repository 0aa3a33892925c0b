"""What Determined's experiment YAML means: the config model (pydantic, one message per bad
key), its schema sections (`slurm:` included) and the `entrypoint` it names."""
