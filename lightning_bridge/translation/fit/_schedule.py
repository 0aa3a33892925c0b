"""`Schedule`: Determined's training schedule, as a pure function of the batches trained.

Computed once from the fit's arguments (and a search's rungs), it answers the loop after every
batch: which boundaries the batch reaches, in Determined's order (the training length,
validation, checkpoint, report; a search's rung is a validation too), and whether the fit has
reached its length. It holds no progress and takes no action: the loop asks, then acts.
`test_mode` trains one batch (every batch then reaches the length boundary), as Determined's.
"""

from __future__ import annotations

import dataclasses
import enum
import sys

from lightning_bridge.contract._units import Batch, Epoch, TrainUnit, check_length, check_period


class Boundary(enum.Enum):
    """What a batch can reach; the loop handles them in this (Determined's) order."""

    LENGTH = "length"
    VALIDATE = "validate"
    CHECKPOINT = "checkpoint"
    REPORT = "report"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Which batch boundaries a fit reaches, and where it ends (see the module docstring)."""

    max_length: TrainUnit
    validation_period: TrainUnit
    checkpoint_period: TrainUnit
    reporting_period: TrainUnit
    test_mode: bool = False
    step_zero_validation: bool = False
    # A search's rungs: batch counts, and epoch counts reached at an epoch's last batch.
    rung_batches: frozenset[int] = frozenset()
    rung_epochs: frozenset[int] = frozenset()

    @classmethod
    def for_fit(
        cls,
        *,
        max_length: TrainUnit | None,
        validation_period: TrainUnit | None,
        checkpoint_period: TrainUnit | None,
        reporting_period: TrainUnit,
        test_mode: bool = False,
        step_zero_validation: bool = False,
    ) -> Schedule:
        """The schedule of `Trainer.fit`'s arguments, checked (no period: never)."""
        return cls(
            max_length=check_length(max_length),
            validation_period=check_period(
                "validation_period", validation_period or Batch(sys.maxsize)
            ),
            checkpoint_period=check_period(
                "checkpoint_period", checkpoint_period or Batch(sys.maxsize)
            ),
            reporting_period=check_period("reporting_period", reporting_period),
            test_mode=test_mode,
            step_zero_validation=step_zero_validation,
        )

    def with_rungs(self, batches: frozenset[int], epochs: frozenset[int]) -> Schedule:
        """This schedule, also validating at a search's rungs."""
        return dataclasses.replace(self, rung_batches=batches, rung_epochs=epochs)

    @property
    def length(self) -> TrainUnit:
        """Where the fit ends (one batch in test mode)."""
        return Batch(1) if self.test_mode else self.max_length

    def remaining(self, batches_trained: int, epochs_trained: int) -> int:
        """Units of `length` left to train (0 or less: the fit is done)."""
        length = self.length
        assert isinstance(length.value, int)
        done = batches_trained if isinstance(length, Batch) else epochs_trained
        return length.value - done

    def total_batches(self, epoch_len: int) -> int | None:
        """The fit's length in batches (None when it has no whole number of them)."""
        length = self.length
        if not isinstance(length, (Batch, Epoch)) or not isinstance(length.value, int):
            return None
        return length.value * (epoch_len if isinstance(length, Epoch) else 1)

    def validates_at_start(self, batches_trained: int) -> bool:
        """Whether the fit validates before its first batch (`step_zero_validation`)."""
        return self.step_zero_validation and batches_trained == 0

    def reached(self, batches_trained: int, epoch_len: int) -> list[Boundary]:
        """The boundaries the batch that made `batches_trained` reaches, in order."""
        batch_idx = batches_trained - 1
        epoch_idx, in_epoch = divmod(batch_idx, epoch_len)
        epoch_end = in_epoch == epoch_len - 1
        reached = []
        for kind, unit in (
            (Boundary.LENGTH, self.max_length),
            (Boundary.VALIDATE, self.validation_period),
            (Boundary.CHECKPOINT, self.checkpoint_period),
            (Boundary.REPORT, self.reporting_period),
        ):
            if (
                (isinstance(unit, Batch) and unit.should_stop(batch_idx + 1))
                or (isinstance(unit, Epoch) and epoch_end and unit.should_stop(epoch_idx + 1))
                or (kind is Boundary.LENGTH and self.test_mode)
                or (
                    kind is Boundary.VALIDATE
                    and self.at_rung(batches_trained, epoch_end, epoch_idx + 1)
                )
            ):
                reached.append(kind)
        return reached

    def at_rung(self, batches_trained: int, epoch_end: bool, epochs: int) -> bool:
        """Whether a search's rung is reached after `batches_trained` batches (`epochs`: the
        epochs trained, counting only when the batch ends an epoch)."""
        return batches_trained in self.rung_batches or (epoch_end and epochs in self.rung_epochs)
