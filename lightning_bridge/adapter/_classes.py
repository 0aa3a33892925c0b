"""The Lightning direction's public classes: `LightningAdapter` and `lightning_trial()`.

Both put the adapter's trial logic (`AdapterMixin`) on a `PyTorchTrial` base: the bridge's, or
Determined's own so the class trains on Determined's `Trainer` too.
"""

from __future__ import annotations

from typing import Any

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._adapter import AdapterMixin
from lightning_bridge.adapter._packages import is_a
from lightning_bridge.contract._trial import PyTorchTrial


class LightningAdapter(AdapterMixin, PyTorchTrial):
    """A `PyTorchTrial` that trains a LightningModule (and optional LightningDataModule).

    Subclass it and pass the module you built (and the `lightning.Trainer` callbacks)::

        class MyTrial(LightningAdapter):
            def __init__(self, context):
                super().__init__(context, MyModule(lr=context.get_hparam("lr")), MyData(),
                                 callbacks=[EarlyStopping(monitor="val_loss")])

    `trial.lightning_module` is the module; `lightning_trial` builds such a class from the
    module's class and the hparams.
    """


def lightning_trial(
    module_class: type,
    datamodule: type | None = None,
    *,
    base: type | None = None,
    callbacks: list[Any] | None = None,
) -> type:
    """A `PyTorchTrial` class training `module_class` (built from the trial's hparams).

    Constructor arguments of the module and the data module are taken from the hparams by
    name (others, like `global_batch_size`, are ignored; a data module's `batch_size` defaults
    to the per-process batch size). `base` is the `PyTorchTrial` to build on: the bridge's
    (default) or `determined.pytorch.PyTorchTrial` to run on Determined's own Trainer.
    `callbacks` are the `lightning.Trainer(callbacks=...)` of the project (each trial gets a
    copy). Classes of the `lightning.pytorch` and `pytorch_lightning` packages are accepted.
    """
    if not (isinstance(module_class, type) and is_a(module_class, "LightningModule")):
        raise InvalidTrialError(
            "lightning_trial() takes a LightningModule class (of lightning.pytorch or "
            f"pytorch_lightning); got {module_class!r}."
        )
    if datamodule is not None and not (
        isinstance(datamodule, type) and is_a(datamodule, "LightningDataModule")
    ):
        raise InvalidTrialError(
            "lightning_trial(datamodule=...) takes a LightningDataModule class (of "
            f"lightning.pytorch or pytorch_lightning); got {datamodule!r}."
        )
    if callbacks is not None and not isinstance(callbacks, (list, tuple)):
        raise InvalidTrialError(
            "lightning_trial(callbacks=...) takes a list of Lightning callbacks; got "
            f"{callbacks!r}."
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
        "_lb_callbacks": None if callbacks is None else list(callbacks),
        "__module__": module_class.__module__,
        "__qualname__": name,
        "__doc__": f"{module_class.__name__} trained as a trial (made by lightning_trial).",
    }
    return type(name, (AdapterMixin, base), namespace)
