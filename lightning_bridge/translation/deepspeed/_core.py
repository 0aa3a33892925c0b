"""`DeepSpeedCore`: a `DeepSpeedTrial` and its progress, as `FitLoop` drives it.

The fit's `TrialCore` keeps everything both trial types share (progress, training windows,
validation reduction, the callbacks' order, observers); this core replaces the parts that are
`PyTorchTrial`'s alone, by concept:

* data: the loaders are built by the ranks the trial's `ModelParallelUnit` names and sharded
  over its data-parallel ranks; an epoch is the rank's micro batches over
  `gradient_accumulation_steps`; a continued run skips the micro batches trained, with the
  data position tracked as for a `PyTorchTrial` (`_trial_data.PassTracker`);
* a batch: the loop draws the batch's source, the training iterator itself, and
  `train_batch(dataloader_iter, epoch_idx, batch_idx)` runs `gradient_accumulation_steps`
  times (once for a pipeline engine, which draws its own micro batches, or when the trial
  disabled automatic accumulation), with Determined's check that the engine stepped;
* validation: `evaluate_batch(dataloader_iter, batch_idx)` over the rank's iterator, or the
  chief's `evaluate_full_dataset`;
* checkpoints: sharded, every process writing its part (`_checkpoint`).
"""

from __future__ import annotations

import inspect
import itertools
import pathlib
from collections.abc import Iterator
from typing import Any, cast

from lightning_bridge._errors import InvalidTrialError, TrialRuntimeError
from lightning_bridge.checkpoint._layout import TrialState
from lightning_bridge.contract._data import dataset_repro_message, is_trial_data_loader
from lightning_bridge.contract._deepspeed import DeepSpeedTrialContext
from lightning_bridge.translation._metrics import check_training_output
from lightning_bridge.translation.deepspeed import _checkpoint
from lightning_bridge.translation.fit._core import TrialCore
from lightning_bridge.translation.fit._trial_data import PassTracker, tracked_loader


class _Passes:
    """A validation "loader" for the fit's loop: one fresh iterator over the rank's loader,
    handed `count` times (each `evaluate_batch` draws from it)."""

    def __init__(self, loader: Any, count: int) -> None:
        self._loader, self._count = loader, count

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self._loader) if self._loader is not None else None
        return itertools.repeat(iterator, self._count)


class DeepSpeedCore(TrialCore):
    """A `DeepSpeedTrial` driven batch by batch by `FitLoop` (see the module docstring)."""

    sharded_checkpoints = True
    trial_base = "DeepSpeedTrial"

    def __init__(
        self,
        trial: Any,
        context: DeepSpeedTrialContext,
        *,
        test_mode: bool = False,
        latest_checkpoint: str | None = None,
    ) -> None:
        # The shared core reads what both contexts have (distributed, reducers, callbacks).
        super().__init__(
            trial, cast(Any, context), test_mode=test_mode, latest_checkpoint=latest_checkpoint
        )
        self.ds_context = context
        self._eval_takes_idx = self.evaluates_batches and _takes_batch_idx(trial)
        self._full_val_loader: Any = None
        self._loader_len = 0
        self._resume_dir: pathlib.Path | None = None
        self._part: dict[str, Any] = {}

    def _check_wrapped(self, context: Any) -> None:
        if not context.models:
            raise InvalidTrialError(
                "The trial wrapped no engine: call context.wrap_model_engine(engine) with the "
                "engine deepspeed.initialize() returns, in the trial's __init__."
            )

    def gradient_scaler(self) -> Any:
        return None  # the engines keep their own loss scaling (checkpointed with them)

    # ----- data -----

    def build_data(self) -> None:
        if self.train_iterator is not None:
            return
        ctx, trial = self.ds_context, self.trial
        mpu = ctx.mpu
        micro = ctx.get_num_micro_batches_per_slot()
        train = None
        tracker = None
        if mpu.should_build_data_loader:
            built = trial.build_training_data_loader()
            train, tracker = self._rank_loader(built, "build_training_data_loader", train=True)
        self._tracker = tracker
        length = len(train) if train is not None else None
        lengths = [n for n in ctx.distributed.allgather(length) if n is not None]
        self._loader_len = min(lengths)
        epoch_len = self._loader_len // micro
        if epoch_len < 1:
            raise InvalidTrialError(
                f"The training data loader holds {self._loader_len} micro batches, fewer than "
                f"one batch of gradient_accumulation_steps={micro}."
            )
        self._set_epoch_len(epoch_len)
        if tracker is not None and self.start_batch:
            done, in_pass = divmod(self.start_batch * micro, len(tracker))
            saved = self._part.get("data") or {}
            tracker._resume_passes = done
            tracker._resume_rng = saved.get("pass_start_rng") if in_pass else None
        val = None
        if mpu.should_build_data_loader:
            built = trial.build_validation_data_loader()
            val, _ = self._rank_loader(built, "build_validation_data_loader", train=False)
        if self.evaluates_batches:
            count = len(val) if val is not None else None
            if count is not None and ctx.use_pipeline_parallel:
                count //= micro
            counts = [n for n in ctx.distributed.allgather(count) if n is not None]
            if not counts or min(counts) == 0:
                raise TrialRuntimeError(
                    "The validation data loader yields no batches: give "
                    "build_validation_data_loader() a non-empty dataset."
                )
            self.val_loader = _Passes(val, min(counts))
        else:
            self._full_val_loader = val
        data: Iterator[Any] | None = iter(train) if train is not None else None
        # What the loop draws for a batch: the iterator `train_batch` draws micro batches from.
        self.train_iterator = itertools.repeat(data)

    def _rank_loader(self, built: Any, fn_name: str, *, train: bool) -> tuple[Any, Any]:
        """This data-parallel rank's torch loader of the trial's `DataLoader` (training:
        repeated, past the micro batches trained, its passes tracked)."""
        ctx = self.ds_context
        mpu = ctx.mpu
        if not is_trial_data_loader(built):
            if not ctx._data_repro_checks_disabled:
                raise TrialRuntimeError(dataset_repro_message(fn_name, built))
            return built, None
        tracker: PassTracker | None = None
        if train:
            built, tracker = tracked_loader(built, {})
        skip = self.start_batch * ctx.get_num_micro_batches_per_slot() if train else 0
        loader = built.get_data_loader(
            repeat=train,
            skip=skip,
            num_replicas=mpu.data_parallel_world_size,
            rank=mpu.data_parallel_rank,
        )
        return loader, tracker

    # ----- training and validation -----

    def train_batch(self, batch: Any) -> None:
        """Train one batch: `batch` is the training iterator the trial draws micro batches
        from (see the module docstring)."""
        ctx, state, trial = self.ds_context, self.state, self.trial
        idx = state.batches_trained
        epoch_len = self.epoch_len
        epoch_idx, in_epoch = divmod(idx, epoch_len)
        if not self.window_open:
            ctx.reset_reducers()
        self.current_batch = idx
        if in_epoch == 0:
            self._epoch_start(epoch_idx)
        micro = ctx.get_num_micro_batches_per_slot()
        calls = 1 if ctx.use_pipeline_parallel or ctx._manual_grad_accumulation else micro
        reports = ctx.mpu.should_report_metrics
        self.in_train_batch = True
        try:
            for _ in range(calls):
                out = trial.train_batch(batch, epoch_idx, idx)
                if reports:
                    self._window.append(check_training_output(out))
        finally:
            self.in_train_batch = False
        engine = ctx.models[0]
        if not ctx.use_pipeline_parallel and engine.micro_steps % micro != 0:
            raise InvalidTrialError(
                f"did not train for gradient accumulation steps: the engine ran "
                f"{engine.micro_steps} micro steps, not a multiple of "
                f"gradient_accumulation_steps={micro}. Call engine.backward() and engine.step() "
                "once per train_batch() call, or call context.disable_auto_grad_accumulation() "
                "and train all of a batch's micro batches in one call."
            )
        state.batches_trained = idx + 1
        if in_epoch == epoch_len - 1:
            for cb in self.trial_callbacks.values():
                cb.on_training_epoch_end(epoch_idx)
            state.epochs_trained += 1

    def _epoch_start(self, epoch_idx: int) -> None:
        for cb in self.trial_callbacks.values():
            if inspect.signature(cb.on_training_epoch_start).parameters:
                cb.on_training_epoch_start(epoch_idx)
            else:
                cb.on_training_epoch_start()

    def validate_batch(self, batch: Any, batch_idx: int) -> None:
        """One validation step: `evaluate_batch` drawing from the rank's iterator (`batch`),
        or the chief's `evaluate_full_dataset`."""
        trial = self.trial
        if not self.evaluates_batches:
            if self.is_chief:
                self._validation.set_full(
                    trial.evaluate_full_dataset(data_loader=self._full_val_loader)
                )
            return
        if self._eval_takes_idx:
            out = trial.evaluate_batch(batch, batch_idx)
        else:
            out = trial.evaluate_batch(batch)
        if self.ds_context.mpu.should_report_metrics:
            self._validation.add_batch(out, batch_idx)

    # ----- checkpoints -----

    def continue_from(self, path: pathlib.Path, state: TrialState | None) -> None:
        """Continue from the checkpoint directory `path` (this rank's part is read now, the
        engines' states where training starts)."""
        self._resume_dir = path
        self._part = _checkpoint.read_part(path, self.context.distributed.rank)
        self._resume = ({}, state)
        self._restored = False
        self.start_batch = state.batches_trained if state is not None else 0

    def restore(self) -> None:
        if self._resume is None or self._restored:
            return
        self._restored = True
        _, state = self._resume
        assert self._resume_dir is not None
        _checkpoint.apply_part(self, self._resume_dir, self._part)
        if state is not None:
            self.state = state

    def data_state(self) -> dict[str, Any]:
        tracker = self._tracker
        return {"pass_start_rng": tracker.pass_start_rng if tracker is not None else None}

    def write_checkpoint_part(self, directory: pathlib.Path, entries: dict[str, Any]) -> None:
        _checkpoint.write_part(self, directory, entries)

    def checkpoint_seal(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return _checkpoint.load_data(self), {}


def _takes_batch_idx(trial: Any) -> bool:
    """Whether the trial's `evaluate_batch` takes `batch_idx` (Determined passes it if so)."""
    params = list(inspect.signature(trial.evaluate_batch).parameters)
    return len(params) >= 2 and params[1] == "batch_idx"
