"""Structural comparison of recorded values, producing readable lists of differences."""

from __future__ import annotations

import difflib
import math
from typing import Any

from .recording import Event

# Relative tolerance for floats passed to callbacks and reported as metrics.  Both sides run the
# same float32 operations on the same data, so values agree to the last bit unless a reduction
# is re-associated (a sum taken in another order); 1e-5 absorbs that and nothing else: any
# behavioural difference (a different batch, a skipped step, another LR) shifts metrics by
# orders of magnitude more.  The absolute floor only matters for values that are exactly 0.
REL_TOL = 1e-5
ABS_TOL = 1e-8
MAX_REPORTED = 40


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def diff_values(expected: Any, got: Any, path: str = "") -> list[str]:
    """Every difference between two normalized values, one line each (empty when they match)."""
    where = path or "<root>"
    if isinstance(expected, dict) and isinstance(got, dict):
        out: list[str] = []
        missing = [k for k in expected if k not in got]
        extra = [k for k in got if k not in expected]
        if missing:
            out.append(f"{where}: missing keys {missing}")
        if extra:
            out.append(f"{where}: unexpected keys {extra}")
        for key in expected:
            if key in got:
                out.extend(diff_values(expected[key], got[key], f"{path}.{key}"))
        return out
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{where}: expected {len(expected)} items {expected!r}, got {len(got)} {got!r}"]
        out = []
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            out.extend(diff_values(e, g, f"{path}[{i}]"))
        return out
    if _is_number(expected) and _is_number(got):
        if isinstance(expected, float) or isinstance(got, float):
            e, g = float(expected), float(got)
            if math.isnan(e) and math.isnan(g):
                return []
            if math.isclose(e, g, rel_tol=REL_TOL, abs_tol=ABS_TOL):
                return []
            return [f"{where}: expected {expected!r}, got {got!r}"]
        return [] if expected == got else [f"{where}: expected {expected!r}, got {got!r}"]
    if type(expected) is not type(got) or expected != got:
        return [f"{where}: expected {expected!r}, got {got!r}"]
    return []


def event_label(event: Event) -> str:
    return f"{event['kind']}:{event['name']}"


def diff_event_sequences(expected: list[Event], got: list[Event]) -> list[str]:
    """Compare two event sequences: first the order of names, then the arguments of each event.

    When the names differ, the differences are shown as a unified diff of the two name sequences
    (hunk headers give the positions) so that a missing, extra or misplaced call is easy to spot.
    """
    exp_names = [event_label(e) for e in expected]
    got_names = [event_label(e) for e in got]
    if exp_names != got_names:
        diff = difflib.unified_diff(
            exp_names,
            got_names,
            fromfile="reference",
            tofile="bridge",
            lineterm="",
            n=3,
        )
        return ["call order differs:", *diff]
    out: list[str] = []
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        out.extend(diff_values(e["args"], g["args"], f"#{i} {event_label(e)}"))
    return out


def format_report(title: str, lines: list[str]) -> str:
    shown = lines[:MAX_REPORTED]
    more = len(lines) - len(shown)
    tail = [f"... and {more} more"] if more > 0 else []
    return "\n".join([title, *shown, *tail])
