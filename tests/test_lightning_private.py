"""A Lightning release without one of the private helpers the adapter reuses breaks only the
adapter, with one message naming what is missing and the Lightning versions to install."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import lightning.pytorch.trainer.connectors.logger_connector.fx_validator as fx

    del fx._FxValidator  # as if this Lightning release had moved it

    import lightning_bridge as pytorch

    print("core:", pytorch.Trainer.__name__, pytorch.PyTorchTrial.__name__)
    try:
        pytorch.lightning_trial
    except ImportError as exc:
        print("adapter:", exc)
    """
)


def test_missing_lightning_helper_breaks_only_the_adapter_with_a_clear_message() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "core: Trainer PyTorchTrial" in out
    adapter_line = next(line for line in out.splitlines() if line.startswith("adapter:"))
    assert "_FxValidator" in adapter_line
    assert "lightning_trial, LightningAdapter" in adapter_line
    assert "pip install 'lightning>=2.4,<2.7'" in adapter_line


def test_the_adapter_is_reachable_from_the_package() -> None:
    import lightning_bridge as pytorch
    from lightning_bridge import LightningAdapter, lightning_trial

    assert pytorch.lightning_trial is lightning_trial
    assert isinstance(LightningAdapter, type)
