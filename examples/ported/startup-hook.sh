#!/bin/sh
# Determined runs this in the task container before the entrypoint. It installs
# the bridge, which trains the LightningModule as a trial, where the trial's
# interpreter (the first python3 on PATH; under `lightning-bridge run`, the
# bridge's own) cannot import it yet, and the packages the copied sources import.
set -e
python3 -c "import lightning_bridge" 2>/dev/null ||
    python3 -m pip install "lightning-bridge==0.1.0"
python3 -m pip install scikit-learn
