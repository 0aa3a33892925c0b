"""Reproducible data loading: the ``DataLoader`` of the trial contract and batch helpers.

A trial's ``build_*_data_loader`` returns a ``DataLoader`` that only *describes* the loading
(dataset, batching, workers). The bridge later asks it for a real
``torch.utils.data.DataLoader`` through ``get_data_loader``, adapting the batch sampler so that
training repeats endlessly, each rank reads its own shard and a resumed run skips the batches
already trained, in the same order and with the same random draws as Determined.

This module imports only torch and numpy.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any, TypeAlias

import numpy as np
import torch
import torch.utils.data as tud

from lightning_bridge.contract import _samplers as samplers

__all__ = [
    "DataLoader",
    "TorchData",
    "adapt_batch_sampler",
    "data_length",
    "dataset_repro_message",
    "is_trial_data_loader",
    "to_device",
]

logger = logging.getLogger("lightning_bridge")

TorchData: TypeAlias = dict[str, torch.Tensor] | Sequence[torch.Tensor] | torch.Tensor

_OPT_OUT = "context.experimental.disable_dataset_reproducibility_checks()"

# numpy dtype kinds torch can hold: float, complex, signed int, unsigned int, bool.
_TENSOR_KINDS = "fciub"


def _type_name(obj: object) -> str:
    """A readable, qualified name for the type of ``obj``."""
    if obj is None:
        return "None"
    cls = type(obj)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _length(batch_sampler: Iterable[Any]) -> int:
    """Number of batches per epoch, with a clear error for an unsized batch sampler."""
    if not isinstance(batch_sampler, Sized):
        raise TypeError(
            f"the batch sampler ({_type_name(batch_sampler)}) has no length, so neither has the "
            "loader; give it a __len__ to let epochs be measured."
        )
    return len(batch_sampler)


class _StopSignalsIgnored:
    """A worker process's init: SIGTERM and SIGINT are for the training process, which stops
    after its batch and shuts its workers down itself (a terminal's Ctrl-C reaches the whole
    process group, workers included); then the user's `worker_init_fn`."""

    def __init__(self, user_fn: Callable[[int], None] | None) -> None:
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if self.user_fn is not None:
            self.user_fn(worker_id)


class DataLoader:
    """A drop-in for ``torch.utils.data.DataLoader`` that lets the bridge control sampling.

    The constructor takes torch's arguments and applies torch's defaults and checks, but no
    torch loader is built until :meth:`get_data_loader` is called; that is where repeating,
    sharding across ranks and skipping already-trained batches are applied. Iterating the object
    directly (or taking ``len``) behaves like a plain torch loader, for use outside a trainer.
    Map-style datasets only.
    """

    def __init__(
        self,
        dataset: tud.Dataset,
        batch_size: int | None = 1,
        shuffle: bool = False,
        sampler: tud.Sampler | Iterable[Any] | None = None,
        batch_sampler: tud.Sampler | Iterable[list[int]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
    ) -> None:
        if isinstance(dataset, tud.IterableDataset):
            raise ValueError(
                f"lightning_bridge.DataLoader needs a map-style dataset, got the IterableDataset "
                f"{_type_name(dataset)}: an iterable dataset cannot be shuffled, sharded or "
                "skipped reproducibly by the bridge. To use it anyway, return a plain "
                "torch.utils.data.DataLoader from your build_*_data_loader method, handle "
                "shuffling, sharding across ranks and skipping on resume yourself, and call "
                f"{_OPT_OUT} in your trial's __init__."
            )
        if batch_size is None and batch_sampler is None:
            raise ValueError(
                "lightning_bridge.DataLoader does not support batch_size=None without a "
                "batch_sampler (unbatched loading); pass a batch_size, or a batch_sampler that "
                "yields lists of indices."
            )
        if num_workers < 0:
            raise ValueError(
                f"num_workers must be non-negative, got {num_workers}; use num_workers=0 to "
                "load in the main process."
            )
        if timeout < 0:
            raise ValueError(f"timeout must be non-negative, got {timeout}.")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor only applies to worker processes; set num_workers > 0 or "
                "leave prefetch_factor=None."
            )
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError(f"prefetch_factor must be non-negative, got {prefetch_factor}.")
        if persistent_workers and num_workers == 0:
            raise ValueError(
                "persistent_workers=True needs worker processes; set num_workers > 0 or "
                "persistent_workers=False."
            )
        if sampler is not None and shuffle:
            raise ValueError(
                "sampler and shuffle=True are mutually exclusive; shuffle inside your sampler "
                "or drop the sampler argument."
            )

        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler is mutually exclusive with batch_size, shuffle, sampler and "
                    "drop_last; configure those on the batch sampler itself."
                )
            batch_size = None
            drop_last = False

        if sampler is None:
            sampler_: Iterable[Any]
            if shuffle:
                sampler_ = tud.RandomSampler(dataset, generator=generator)  # type: ignore[arg-type]
            else:
                sampler_ = tud.SequentialSampler(dataset)  # type: ignore[arg-type]
            sampler = sampler_

        if batch_sampler is None:
            assert batch_size is not None
            batch_sampler = tud.BatchSampler(sampler, batch_size, drop_last)

        if collate_fn is None:
            collate_fn = tud.default_collate

        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers

    @property
    def _auto_collation(self) -> bool:
        """Whether samples are grouped into batches (always, for this loader)."""
        return self.batch_sampler is not None

    def get_data_loader(
        self, repeat: bool = False, skip: int = 0, num_replicas: int = 1, rank: int = 0
    ) -> tud.DataLoader:
        """Build the torch loader for one rank.

        ``repeat`` cycles the batches forever (training), ``num_replicas``/``rank`` keep every
        ``num_replicas``-th batch starting at ``rank``, and ``skip`` drops that many of this
        rank's batches (resuming).
        """
        adapted = adapt_batch_sampler(
            self.batch_sampler, repeat=repeat, skip=skip, num_replicas=num_replicas, rank=rank
        )
        return tud.DataLoader(
            self.dataset,
            batch_sampler=adapted,
            num_workers=self.num_workers,
            collate_fn=self.collate_fn,
            pin_memory=self.pin_memory,
            timeout=self.timeout,
            worker_init_fn=_StopSignalsIgnored(self.worker_init_fn) if self.num_workers else None,
            multiprocessing_context=self.multiprocessing_context,
            generator=self.generator,
            prefetch_factor=self.prefetch_factor,
            persistent_workers=self.persistent_workers,
        )

    def __iter__(self) -> Iterator[Any]:
        return iter(self.get_data_loader())

    def __len__(self) -> int:
        return _length(self.batch_sampler)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dataset={_type_name(self.dataset)}, "
            f"batch_size={self.batch_size}, batches={_length(self.batch_sampler)}, "
            f"num_workers={self.num_workers})"
        )


def adapt_batch_sampler(
    batch_sampler: Iterable[list[int]],
    repeat: bool = False,
    skip: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
) -> Iterable[list[int]]:
    """Wrap ``batch_sampler`` for training: repeat, then shard, then skip.

    The skip comes last because a resumed rank counts the batches it trained itself, which are
    the batches the sharded sampler emits.
    """
    if num_replicas < 1:
        raise ValueError(
            f"num_replicas must be at least 1, got {num_replicas}; pass the number of "
            "processes that share the data."
        )
    if not 0 <= rank < num_replicas:
        raise ValueError(
            f"rank must be in [0, num_replicas), got rank={rank} with num_replicas={num_replicas}."
        )
    if skip < 0:
        raise ValueError(f"skip must be non-negative, got {skip}.")

    adapted: Iterable[list[int]] = batch_sampler
    if repeat:
        adapted = samplers.RepeatBatchSampler(adapted)
    if num_replicas > 1:
        adapted = samplers.DistributedBatchSampler(adapted, num_replicas, rank)
    if skip > 0:
        adapted = samplers.SkipBatchSampler(adapted, skip)
    return adapted


def _first_array_leaf(data: Any) -> np.ndarray | torch.Tensor | None:
    """Depth-first search for the first tensor or array in a nest of dicts/lists/tuples."""
    if isinstance(data, np.ndarray | torch.Tensor):
        return data
    if isinstance(data, Mapping):
        children: Any = data.values()
    elif isinstance(data, list | tuple):
        children = data
    else:
        return None
    for child in children:
        leaf = _first_array_leaf(child)
        if leaf is not None:
            return leaf
    return None


def data_length(data: Any) -> int:
    """Number of records in a batch: the length of its first tensor or array.

    Accepts a tensor, an array, or dicts/lists/tuples nesting them; every leaf is assumed to
    hold the same number of records. A container without any tensor falls back to the length
    of its first element (e.g. a list of strings).
    """
    if isinstance(data, np.ndarray | torch.Tensor):
        if data.ndim == 0:
            raise ValueError(
                "cannot take the batch length of a 0-dimensional tensor or array; batches "
                "need a leading batch dimension."
            )
        return len(data)
    if not isinstance(data, Mapping | list | tuple):
        raise TypeError(
            f"cannot take the batch length of a {_type_name(data)}; batches must be a tensor, "
            "an np.ndarray, or a dict/list/tuple of them (override get_batch_length in your "
            "trial for custom batch types)."
        )
    if len(data) == 0:
        raise ValueError(
            f"cannot take the batch length of an empty {type(data).__name__}; a batch needs "
            "at least one tensor or np.ndarray in it."
        )
    leaf = _first_array_leaf(data)
    if leaf is not None:
        return data_length(leaf)
    first = next(iter(data.values())) if isinstance(data, Mapping) else data[0]
    try:
        return len(first)
    except TypeError:
        raise TypeError(
            f"cannot take the batch length of this {type(data).__name__}: it holds no tensor "
            f"or np.ndarray and its first element ({_type_name(first)}) has no length "
            "(override get_batch_length in your trial for custom batch types)."
        ) from None


def to_device(data: Any, device: torch.device | str, warned_types: set[type] | None = None) -> Any:
    """Move a batch to ``device``, recursing through dicts, lists and tuples.

    Numeric numpy arrays become tensors; anything with a callable ``.to`` (tensors, modules,
    custom batch classes) is moved with it. Anything else is returned unchanged with a warning,
    logged once per type per ``warned_types`` set (pass the same set to warn once overall).
    """
    if warned_types is None:
        warned_types = set()

    if isinstance(data, dict):
        return {key: to_device(value, device, warned_types) for key, value in data.items()}
    if isinstance(data, list):
        return [to_device(item, device, warned_types) for item in data]
    if isinstance(data, tuple):
        moved = [to_device(item, device, warned_types) for item in data]
        if hasattr(data, "_fields"):  # namedtuple: keep its type
            return type(data)(*moved)
        return tuple(moved)
    if isinstance(data, np.ndarray):
        if data.dtype.kind in _TENSOR_KINDS:
            return torch.from_numpy(data).to(device)
    elif callable(getattr(data, "to", None)):
        return data.to(device)

    if type(data) not in warned_types:
        warned_types.add(type(data))
        logger.warning(
            "Could not move an item of type '%s' to device %s; it is passed on unchanged.",
            type(data).__name__,
            device,
        )
    return data


def dataset_repro_message(fn_name: str, data_obj: object) -> str:
    """The error text for a ``build_*_data_loader`` that returned a non-bridge loader."""
    returned = "None" if data_obj is None else f"an instance of {_type_name(data_obj)}"
    return (
        f"{fn_name}() returned {returned}, which is not a "
        "lightning_bridge.DataLoader. For map-style datasets, lightning_bridge.DataLoader is a "
        "drop-in replacement for torch.utils.data.DataLoader (same arguments) that keeps data "
        "order reproducible across pauses, restarts and ranks; return one instead. If you "
        "cannot (e.g. an IterableDataset), you are responsible for shuffling, sharding and "
        f"skipping yourself: call {_OPT_OUT} in your trial's __init__ to allow other loaders."
    )


def is_trial_data_loader(obj: object) -> bool:
    """Whether ``obj`` is a reproducible trial loader: the bridge's or Determined's."""
    if isinstance(obj, DataLoader):
        return True
    if isinstance(obj, type):
        return False
    return callable(getattr(obj, "get_data_loader", None)) and hasattr(obj, "batch_sampler")
