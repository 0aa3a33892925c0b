"""LitClassifier on DigitsDataModule as a Determined trial, written by `lightning-bridge port`.

Regenerate this folder, from the folder the classes are imported from, with
`lightning-bridge port TARGET --datamodule DATAMODULE --out <this folder> --force`,
TARGET being lit_model:LitClassifier,
DATAMODULE being data:DigitsDataModule.
"""

from lightning_bridge import lightning_trial

try:
    # Determined's base class where Determined is installed (on a cluster, or when
    # `lightning-bridge run` maps `determined` onto the bridge).
    from determined.pytorch import PyTorchTrial
except ImportError:
    from lightning_bridge import PyTorchTrial

from data import DigitsDataModule
from lit_model import LitClassifier

_PortedTrial = lightning_trial(
    LitClassifier,
    datamodule=DigitsDataModule,
    base=PyTorchTrial,
)


class LitClassifierTrial(_PortedTrial):
    """LitClassifier on DigitsDataModule, built from the hyperparameters in const.yaml."""
