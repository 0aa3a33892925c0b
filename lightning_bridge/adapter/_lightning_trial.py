"""The Lightning direction's public classes: `LightningAdapter` and `lightning_trial()`.

Both are a `PyTorchTrial` whose methods hand the trainer's calls to one `LightningRun` (the
module's fit under a trial, `_run`), built on the bridge's `PyTorchTrial` or on Determined's
own so that the class trains on Determined's `Trainer` too. They use only the trial contract
(`wrap_model`, `wrap_optimizer`, `wrap_lr_scheduler`, `wrap_reducer`, `backward`,
`step_optimizer`, callbacks). Modules of the `lightning.pytorch` and the `pytorch_lightning`
packages are both accepted (`_lightning_packages`).
"""

from __future__ import annotations

import copy
import importlib
import types
from typing import Any

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._lightning_packages import is_a
from lightning_bridge.adapter._module_data import build_from_hparams, constructor_arguments
from lightning_bridge.adapter._run import LightningRun
from lightning_bridge.adapter._trial_callback import trial_callback
from lightning_bridge.contract._trial import PyTorchTrial, is_determined_trial_base
from lightning_bridge.translation._lightning_private import require_adapter_helpers

require_adapter_helpers()


def _api_of(cls: type) -> types.ModuleType:
    """The `determined.pytorch`-like module whose `PyTorchTrial` the class is built on."""
    if any(is_determined_trial_base(klass) for klass in cls.__mro__):
        return importlib.import_module("determined.pytorch")
    return importlib.import_module("lightning_bridge")


class LightningTrialMethods:
    """The `PyTorchTrial` methods of a Lightning trial, whatever its `PyTorchTrial` base.

    `lightning_module`, `datamodule`, `model` (the wrapped module) and `optimizers` (the
    wrapped optimizers) are the trial's; `lightning_run` is the `LightningRun` they train in.
    """

    _lb_module_class: type | None = None
    _lb_datamodule_class: type | None = None
    _lb_callbacks: list[Any] | None = None

    def __init__(
        self,
        context: Any,
        lightning_module: Any = None,
        datamodule: Any = None,
        callbacks: list[Any] | None = None,
    ) -> None:
        self.context = context
        hparams = dict(context.get_hparams())
        constructor_args: set[str] | None = None
        if lightning_module is None:
            if self._lb_module_class is None:
                raise InvalidTrialError(
                    "LightningAdapter needs a LightningModule: call "
                    "super().__init__(context, MyModule(...)) or use lightning_trial(MyModule)."
                )
            lightning_module = build_from_hparams(
                self._lb_module_class, hparams, context, "LightningModule"
            )
            constructor_args = set(constructor_arguments(self._lb_module_class))
        if datamodule is None and self._lb_datamodule_class is not None:
            datamodule = build_from_hparams(
                self._lb_datamodule_class, hparams, context, "LightningDataModule"
            )
            if constructor_args is not None:
                constructor_args |= set(constructor_arguments(self._lb_datamodule_class))
        if callbacks is None and self._lb_callbacks is not None:
            callbacks = copy.deepcopy(self._lb_callbacks)  # each trial gets its own state
        if not is_a(lightning_module, "LightningModule"):
            raise InvalidTrialError(
                "LightningAdapter takes a LightningModule (of lightning.pytorch or "
                f"pytorch_lightning); got {type(lightning_module).__name__}."
            )
        if datamodule is not None and not is_a(datamodule, "LightningDataModule"):
            raise InvalidTrialError(
                "datamodule must be a LightningDataModule (of lightning.pytorch or "
                f"pytorch_lightning); got {type(datamodule).__name__}."
            )
        self.lightning_module = lightning_module
        self.datamodule = datamodule
        run = LightningRun(
            context,
            _api_of(type(self)),
            lightning_module,
            datamodule,
            list(callbacks or []),
            constructor_args,
        )
        self.lightning_run = run
        self.model = run.model
        self.optimizers = run.optimizers

    def build_training_data_loader(self) -> Any:
        return self.lightning_run.training_loader()

    def build_validation_data_loader(self) -> Any:
        return self.lightning_run.validation_loader()

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        return self.lightning_run.train_batch(batch, epoch_idx, batch_idx)

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return self.lightning_run.validation_batch(batch, batch_idx)

    def get_batch_length(self, batch: Any) -> int:
        return self.lightning_run.batch_length(batch)

    def build_callbacks(self) -> dict[str, Any]:
        run = self.lightning_run
        return {"lightning_adapter": trial_callback(run.api, run)}


class LightningAdapter(LightningTrialMethods, PyTorchTrial):
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
    return type(name, (LightningTrialMethods, base), namespace)
