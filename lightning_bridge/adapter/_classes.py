"""The Lightning direction's public classes: `LightningAdapter` and `lightning_trial()`.

Both put the adapter's trial logic (`AdapterMixin`) on a `PyTorchTrial` base: the bridge's, or
Determined's own so the class trains on Determined's `Trainer` too.
"""

from __future__ import annotations

import lightning.pytorch as pl

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._adapter import AdapterMixin
from lightning_bridge.contract._trial import PyTorchTrial


class LightningAdapter(AdapterMixin, PyTorchTrial):
    """A `PyTorchTrial` that trains a LightningModule (and optional LightningDataModule).

    Subclass it and pass the module you built::

        class MyTrial(LightningAdapter):
            def __init__(self, context):
                super().__init__(context, MyModule(lr=context.get_hparam("lr")), MyData())

    `trial.lightning_module` is the module; `lightning_trial` builds such a class from the
    module's class and the hparams.
    """


def lightning_trial(
    module_class: type,
    datamodule: type | None = None,
    *,
    base: type | None = None,
) -> type:
    """A `PyTorchTrial` class training `module_class` (built from the trial's hparams).

    Constructor arguments of the module and the data module are taken from the hparams by
    name (others, like `global_batch_size`, are ignored; a data module's `batch_size` defaults
    to the per-process batch size). `base` is the `PyTorchTrial` to build on: the bridge's
    (default) or `determined.pytorch.PyTorchTrial` to run on Determined's own Trainer.
    """
    if not (isinstance(module_class, type) and issubclass(module_class, pl.LightningModule)):
        raise InvalidTrialError(
            f"lightning_trial() takes a LightningModule class; got {module_class!r}."
        )
    if datamodule is not None and not (
        isinstance(datamodule, type) and issubclass(datamodule, pl.LightningDataModule)
    ):
        raise InvalidTrialError(
            f"lightning_trial(datamodule=...) takes a LightningDataModule class; got "
            f"{datamodule!r}."
        )
    base = PyTorchTrial if base is None else base
    if not (isinstance(base, type) and base.__name__ == "PyTorchTrial"):
        raise InvalidTrialError(
            "lightning_trial(base=...) takes lightning_bridge.PyTorchTrial or "
            f"determined.pytorch.PyTorchTrial; got {base!r}."
        )
    name = f"{module_class.__name__}Trial"
    namespace = {
        "_lb_module_class": module_class,
        "_lb_datamodule_class": datamodule,
        "__module__": module_class.__module__,
        "__qualname__": name,
        "__doc__": f"{module_class.__name__} trained as a trial (made by lightning_trial).",
    }
    return type(name, (AdapterMixin, base), namespace)
