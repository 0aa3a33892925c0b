#!/bin/sh
# Determined runs this in the task container before the entrypoint: it installs
# the bridge, which trains the LightningModule as a trial, and the packages the
# copied sources import.
set -e
pip install "lightning-bridge==0.1.0" scikit-learn
