"""Determined's mixed-precision calls, translated to native AMP under Lightning.

`use_amp()` (and `configure_apex_amp()`, since apex is unmaintained) ask for Lightning's
`16-mixed` precision plugin: autocast around the step, loss scaling in `backward`, unscaling
before the trial's gradient clipping, and steps skipped on inf/NaN gradients. A scaler given to
`wrap_scaler()` is the trial's own: it scales its losses and the bridge steps optimizers through
it, as Determined does. Like Determined, these calls do nothing without a GPU; for mixed
precision on the CPU use `init(precision="bf16-mixed")`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from lightning_bridge._errors import InvalidTrialError

logger = logging.getLogger("lightning_bridge")

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


def _to_float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    if isinstance(value, dict):
        return {k: _to_float32(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_float32(v) for v in value)
    return value


class AutocastForward(torch.nn.Module):
    """Runs a model's forward under autocast and hands back float32 outputs for the loss."""

    def __init__(self, module: torch.nn.Module, device_type: str) -> None:
        super().__init__()
        self.module = module
        self._device_type = device_type

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self._device_type):
            out = self.module(*args, **kwargs)
        return _to_float32(out)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["module"], name)


def autocast_forward(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`module` with its forward under autocast on a GPU; unchanged (with a warning) on the
    CPU, as in Determined."""
    if device.type != "cuda":
        message = "autocast_forward_pass() has no effect without a GPU (as in Determined)."
        warn_once("autocast-cpu", message)
        return module
    return AutocastForward(module, device.type)


def check_scaler(scaler: Any) -> Any:
    """`scaler` if it has a gradient scaler's methods; else an error naming the one missing."""
    for method in ("scale", "step", "update", "unscale_", "state_dict", "load_state_dict"):
        if not callable(getattr(scaler, method, None)):
            raise InvalidTrialError(
                f"wrap_scaler() takes a gradient scaler such as torch.amp.GradScaler(); "
                f"{type(scaler).__name__} has no {method}()."
            )
    return scaler
