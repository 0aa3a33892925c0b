"""InvalidHP against Determined's own: the real `determined.InvalidHP` is recognised, and both
classes take a message string only."""

from __future__ import annotations

import pytest

determined = pytest.importorskip("determined")

from lightning_bridge import InvalidHP  # noqa: E402
from lightning_bridge._errors import is_invalid_hp  # noqa: E402

pytestmark = pytest.mark.interop


def test_determined_invalid_hp_is_recognised() -> None:
    reference = determined.InvalidHP("batch size too large")
    assert is_invalid_hp(reference) and is_invalid_hp(InvalidHP("batch size too large"))
    assert reference.msg == InvalidHP("batch size too large").msg
    assert determined.InvalidHP().msg == InvalidHP().msg
    for cls in (determined.InvalidHP, InvalidHP):
        with pytest.raises(TypeError):
            cls(3)
