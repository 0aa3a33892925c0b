"""`python -m lightning_bridge ...`: the `lightning-bridge` command."""

import sys

from lightning_bridge.experiment._cli import main

if __name__ == "__main__":
    sys.exit(main())
