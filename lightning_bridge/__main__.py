"""`python -m lightning_bridge ...`: the `lightning-bridge` command."""

from lightning_bridge.experiment.cli._main import command

if __name__ == "__main__":
    command()
