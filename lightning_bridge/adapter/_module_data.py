"""Data side of a ported LightningModule: constructor arguments from hparams, its loaders.

The module's (or data module's) `train_dataloader()` is handed to the trial's trainer as a
loader that repeats epoch after epoch (a trial's training data never runs out), re-iterating
the user's `DataLoader` each pass exactly as Lightning does, so shuffling draws the same
permutations. Several validation loaders become one loader that runs them one after another
(Lightning's sequential mode), each batch tagged with its loader's index. Under several
processes the loaders get a `DistributedSampler`, as Lightning's DDP strategy gives them.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterator
from typing import Any

import torch

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._lightning_callbacks import call_hook
from lightning_bridge.adapter._lightning_packages import overrides
from lightning_bridge.adapter._trainer_arguments import TrainerSettings
from lightning_bridge.translation._lightning_private import _set_sampler_epoch

_MISSING = inspect.Parameter.empty


def constructor_arguments(cls: type) -> dict[str, inspect.Parameter]:
    """The named arguments of `cls.__init__` (not `*args` / `**kwargs`)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return {}
    return {
        name: p for name, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def build_from_hparams(cls: type, hparams: dict[str, Any], context: Any, what: str) -> Any:
    """`cls(**matching hparams)`; `batch_size` defaults to the per-process batch size."""
    kwargs: dict[str, Any] = {}
    missing: list[str] = []
    unfilled: list[str] = []
    for name, param in constructor_arguments(cls).items():
        if name in hparams:
            if hparams[name] is None and param.default is _MISSING:
                unfilled.append(name)
            kwargs[name] = hparams[name]
        elif name == "batch_size" and "global_batch_size" in hparams:
            kwargs[name] = context.get_per_slot_batch_size()
        elif param.default is _MISSING:
            missing.append(name)
    if missing:
        raise InvalidTrialError(
            f"{what} {cls.__name__}.__init__ needs {', '.join(map(repr, missing))}, which the "
            "trial's hparams do not have: add them to hparams (constructor arguments are "
            "matched to hparams by name)."
        )
    if unfilled:
        raise InvalidTrialError(
            f"{what} {cls.__name__}.__init__ takes {', '.join(map(repr, unfilled))} without a "
            "default, and the hparams give null: fill in the value (lightning-bridge port "
            "writes such arguments as null for you to fill)."
        )
    return cls(**kwargs)


def hook_owner(name: str, module: Any, datamodule: Any) -> Any:
    """Which object's shared data hook runs: the data module's when it overrides it."""
    if overrides(datamodule, name, "LightningDataModule"):
        return datamodule
    return module


def loaders_of(returned: Any, hook: str, *, several: bool) -> list[Any]:
    """The loaders `hook` returned (one, or with `several` a list / tuple / dict of them)."""
    if returned is None:
        raise InvalidTrialError(f"{hook}() returned None; return a torch DataLoader.")
    if isinstance(returned, (list, tuple, dict)):
        if not several:
            raise InvalidTrialError(
                f"{hook}() returned {len(returned)} data loaders; a trial trains on one loader. "
                "Return a single DataLoader (combine datasets with ConcatDataset)."
            )
        loaders = list(returned.values() if isinstance(returned, dict) else returned)
        if not loaders:
            raise InvalidTrialError(f"{hook}() returned no data loader; return a DataLoader.")
    else:
        loaders = [returned]
    for loader in loaders:
        if not hasattr(loader, "__iter__"):
            raise InvalidTrialError(
                f"{hook}() returned a {type(loader).__name__}; return a torch DataLoader."
            )
    return loaders


class Tagged:
    """A validation batch from one of several loaders, with its loader and batch index."""

    def __init__(self, batch: Any, dataloader_idx: int, batch_idx: int) -> None:
        self.batch = batch
        self.dataloader_idx = dataloader_idx
        self.batch_idx = batch_idx


class _Sequential(torch.utils.data.IterableDataset):
    """Several validation loaders one after another, as Lightning's sequential mode runs them
    (each cut to its limit, where one is given)."""

    def __init__(self, loaders: list[Any], limits: list[int | None]) -> None:
        self.loaders = loaders
        self.limits = limits

    def __iter__(self) -> Iterator[Tagged]:
        for dataloader_idx, (loader, limit) in enumerate(
            zip(self.loaders, self.limits, strict=True)
        ):
            batches = iter(loader) if limit is None else itertools.islice(iter(loader), limit)
            for batch_idx, batch in enumerate(batches):
                yield Tagged(batch, dataloader_idx, batch_idx)

    def __len__(self) -> int:
        return sum(
            len(loader) if limit is None else limit
            for loader, limit in zip(self.loaders, self.limits, strict=True)
        )


def _own_loader(dataset: Any) -> Any:
    """A torch DataLoader (what trainers expect) around the adapter's own `dataset`.

    Making a DataLoader's iterator draws its base seed from the loader's generator, or from the
    global RNG without one. Lightning has no such loader, so it gets a generator of its own: a
    validation that Lightning would not run (or runs without this wrapper) draws nothing from
    the global RNG, and training that uses it (dropout, noise) goes on as under Lightning.
    """
    return torch.utils.data.DataLoader(
        dataset, batch_size=None, collate_fn=_keep, generator=torch.Generator()
    )


def sequential_loader(loaders: list[Any], limits: list[int | None]) -> Any:
    """One loader that runs `loaders` in order (each draws what it draws under Lightning)."""
    return _own_loader(_Sequential(loaders, limits))


def _keep(item: Any) -> Any:
    return item


class NoValidation:
    """The one batch of a module without validation_step: validation reports training values."""


def no_validation_loader() -> Any:
    """The validation loader of a module Lightning would not validate: one `NoValidation`."""
    items: Any = [NoValidation()]
    return _own_loader(items)


def distributed_loader(loader: Any, rank: int, size: int, *, shuffle: bool) -> Any:
    """`loader` with a DistributedSampler for this process (as Lightning's DDP strategy)."""
    if size <= 1 or not isinstance(loader, torch.utils.data.DataLoader):
        return loader
    if isinstance(loader.sampler, torch.utils.data.DistributedSampler):
        return loader
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return loader
    from lightning_bridge.translation._lightning_private import (
        _get_distributed_sampler,
        _update_dataloader,
    )

    # Lightning's own choice of sampler: a DistributedSampler over the dataset for the default
    # samplers, a DistributedSamplerWrapper around any other (so its order and weights are
    # kept), seeded from `seed_everything` (PL_GLOBAL_SEED). Unlike lightning.Trainer, which
    # shuffles every training loader under DDP, a loader that does not shuffle keeps its order.
    shuffle = shuffle and isinstance(loader.sampler, torch.utils.data.RandomSampler)
    sampler = _get_distributed_sampler(
        loader, shuffle=shuffle, overfit_batches=0, num_replicas=size, rank=rank
    )
    return _update_dataloader(loader, sampler)


class RepeatingLoader:
    """The training loader as a trial sees it: `len` is one epoch, iteration never ends.

    Each pass re-iterates the user's loader (and sets its sampler's epoch), taking the epoch's
    batches (`epoch_len`, fewer than the loader's under `limit_train_batches`), so an epoch
    sees what Lightning's epoch sees. A continued trial skips the batches already trained.
    """

    def __init__(self, loader: Any, start_batch: Any, epoch_len: int | None) -> None:
        self.loader = loader
        self._start_batch = start_batch
        self._epoch_len = epoch_len

    def __len__(self) -> int:
        return len(self.loader) if self._epoch_len is None else self._epoch_len

    def __iter__(self) -> Iterator[Any]:
        start = int(self._start_batch())
        epoch_len = self._epoch_len or 0
        epoch, skip = divmod(start, epoch_len) if epoch_len else (0, 0)
        while True:
            _set_sampler_epoch(self.loader, epoch)
            # Like Lightning, take one epoch's batches and drop the iterator without running
            # it to exhaustion (which would draw one more permutation from a shuffling
            # sampler's generator and change the next epoch's order).
            batches = iter(self.loader)
            passes = itertools.islice(batches, epoch_len) if epoch_len else batches
            produced = False
            for i, batch in enumerate(passes):
                produced = True
                if i < skip:
                    continue
                yield batch
            del batches, passes
            skip = 0
            epoch += 1
            if not produced:
                return


class TrainingData:
    """The module's (or data module's) training loader, built once, when first asked for: the
    module may ask through `self.trainer` (`num_training_batches`, `max_epochs`, ...) while it
    configures its optimizers, before the trainer asks for the trial's loader."""

    def __init__(
        self, module: Any, datamodule: Any, context: Any, settings: TrainerSettings
    ) -> None:
        self._module = module
        self._datamodule = datamodule
        self._context = context
        self._settings = settings
        self._loader: Any = None
        self._epoch_len: int | None = None

    def loader(self) -> Any:
        """This process's training loader (with Lightning's distributed sampler)."""
        if self._loader is None:
            module, dm = self._module, self._datamodule
            if not (
                overrides(module, "train_dataloader", "LightningModule")
                or overrides(dm, "train_dataloader", "LightningDataModule")
            ):
                raise InvalidTrialError(
                    f"{type(module).__name__} has no train_dataloader(): define it on the "
                    "module or pass a LightningDataModule that defines it."
                )
            owner = hook_owner("train_dataloader", module, dm)
            returned = (
                call_hook(module, "train_dataloader")
                if owner is module
                else owner.train_dataloader()
            )
            (loader,) = loaders_of(returned, "train_dataloader", several=False)
            dist = self._context.distributed
            self._loader = distributed_loader(loader, dist.rank, dist.size, shuffle=True)
            try:
                self._epoch_len = self._settings.train_batches(len(self._loader))
            except TypeError:
                self._epoch_len = None
            self._check_aggregation()
        return self._loader

    def epoch_len(self) -> int | None:
        """Batches per epoch of this process's loader (None for a loader without a length)."""
        self.loader()
        return self._epoch_len

    def for_trial(self) -> RepeatingLoader:
        """What `build_training_data_loader` hands the trainer."""
        return RepeatingLoader(self.loader(), self._context.get_initial_batch, self.epoch_len())

    def _check_aggregation(self) -> None:
        k, epoch_len = self._settings.accumulate_grad_batches, self._epoch_len
        if self._settings.aggregation and epoch_len and epoch_len % k:
            raise InvalidTrialError(
                f"optimizations.aggregation_frequency is {k} but an epoch has {epoch_len} "
                "batches: Lightning steps the optimizer on each epoch's last batch, the trial's "
                f"aggregation every {k} batches. Choose an aggregation_frequency that divides "
                "the epoch, or remove it and set hparams['accumulate_grad_batches'] (the "
                "adapter then accumulates as Lightning does)."
            )


def validation_loader(
    module: Any, datamodule: Any, context: Any, settings: TrainerSettings
) -> tuple[Any, bool]:
    """(the trial's validation loader, whether it chains several) from `val_dataloader()`,
    each loader cut to `limit_val_batches` as Lightning cuts it."""
    owner = hook_owner("val_dataloader", module, datamodule)
    returned = call_hook(module, "val_dataloader") if owner is module else owner.val_dataloader()
    dist = context.distributed
    loaders = [
        distributed_loader(loader, dist.rank, dist.size, shuffle=False)
        for loader in loaders_of(returned, "val_dataloader", several=True)
    ]
    limits = [_val_limit(loader, settings) for loader in loaders]
    if len(loaders) > 1:
        return sequential_loader(loaders, limits), True
    if limits[0] is not None:
        return _own_loader(_Limited(loaders[0], limits[0])), False
    return loaders[0], False


def _val_limit(loader: Any, settings: TrainerSettings) -> int | None:
    """How many of `loader`'s batches validation runs (None: all)."""
    if settings.limit_val_batches == 1.0:
        return None
    try:
        length = len(loader)
    except TypeError:
        if isinstance(settings.limit_val_batches, int):
            return settings.limit_val_batches
        raise InvalidTrialError(
            "hparams['limit_val_batches'] is a fraction, but the validation loader has no "
            "length; give a number of batches (an int), as lightning.Trainer asks."
        ) from None
    count = settings.val_batches(length)
    return None if count >= length else count


class _Limited(torch.utils.data.IterableDataset):
    """The first `count` batches of a loader (`limit_val_batches`)."""

    def __init__(self, loader: Any, count: int) -> None:
        self.loader = loader
        self.count = count

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.loader), self.count)

    def __len__(self) -> int:
        return self.count
