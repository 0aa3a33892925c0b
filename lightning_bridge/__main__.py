"""`python -m lightning_bridge ...`: the `lightning-bridge` command."""

from lightning_bridge.experiment._cli import command

if __name__ == "__main__":
    command()
