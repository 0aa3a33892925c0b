"""The places where the bridge reaches into Lightning's fit loop.

Determined validates at batch boundaries that Lightning's `val_check_interval` cannot express
(schedules, epoch periods, "validate unless already current"), and in a fixed order with
checkpoints. So under `lightning_bridge.Trainer` Lightning's own validation scheduling is turned
off and the bridge runs Lightning's validation loop itself at Determined's moments. Both steps
use the fit loop's attributes that have been stable across Lightning 2.x; if they move, the
check below fails with a clear message instead of validating at the wrong time.

Lightning's SIGTERM handler is also kept out: the bridge stops on signals itself (`_stop`),
at a batch every process agrees on.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl


def _epoch_loop(trainer: pl.Trainer) -> Any:
    loop = getattr(trainer.fit_loop, "epoch_loop", None)
    if loop is None or not hasattr(loop, "_should_check_val_fx") or not hasattr(loop, "val_loop"):
        raise RuntimeError(
            f"lightning {pl.__version__} has a fit loop lightning_bridge does not know; "
            "install a supported Lightning 2.x release (2.4 to 2.6)."
        )
    return loop


def disable_scheduled_validation(trainer: pl.Trainer) -> None:
    """Stop Lightning from deciding when to validate; the bridge decides."""
    _epoch_loop(trainer)._should_check_val_fx = lambda *args, **kwargs: False


def run_validation(trainer: pl.Trainer) -> None:
    """Run Lightning's validation loop now, as the fit loop does between training batches."""
    loop = _epoch_loop(trainer)
    connector = trainer._logger_connector
    first_loop_iter = getattr(connector, "_first_loop_iter", None)
    trainer.validating = True
    try:
        loop.val_loop.run()
    finally:
        trainer.training = True
        if first_loop_iter is not None:
            connector._first_loop_iter = first_loop_iter


def keep_signal_handlers(trainer: pl.Trainer) -> None:
    """Keep Lightning from installing its SIGTERM handler for this fit.

    Its handler broadcasts a tensor from inside the signal handler, which pairs with whatever
    collective the other processes are in, and it ends the fit without a checkpoint; the
    bridge's handlers (installed for the whole fit) stay in place instead."""
    connector = getattr(trainer, "_signal_connector", None)
    if connector is not None and hasattr(connector, "register_signal_handlers"):
        connector.register_signal_handlers = lambda: None
