"""The trial contract: what a trial written for `determined.pytorch` is built against.

`PyTorchTrial`, `PyTorchCallback`, `PyTorchTrialContext`, `Batch` / `Epoch`, reducers, the LR
scheduler wrapper, the reproducible `DataLoader` and samplers and the distributed context (the
cluster info a script reads is the translation's `RunDescription`). Nothing here imports
Lightning: the context hands backward passes and optimizer steps to whatever drives the trial
(a `StepDriver`), which the translation layer provides. The public names are re-exported
from `lightning_bridge`.
"""
