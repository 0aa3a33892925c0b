"""ASHA's arithmetic as Determined 0.38 computes it: brackets, rung lengths, the stop rule.

adaptive_asha runs several brackets side by side, each an async_halving search with its own
number of rungs, share of `max_trials` and share of `max_concurrent_trials`:

- rung lengths of a bracket with n rungs: max(int(max_length / divisor ** (n - i - 1)), 1);
- the number of rungs is capped so the top rung still holds a trial:
  min(max_rungs, int(log(max_length) / log(divisor)) + 1, int(log(max_trials) / log(divisor)) + 1),
  and `mode` turns it into brackets (aggressive: [n]; standard: the upper half of 1..n;
  conservative: 1..n) unless `bracket_rungs` names them; brackets run most rungs first;
- trials per bracket give each bracket about the same total training; concurrency is split
  evenly, the remainder to the first brackets;
- a trial reaching a rung is ranked among the metrics already in that rung (ties rank the new
  one first); it continues when its rank is below max(int(len(rung) / divisor), 1), and is
  stopped otherwise, or when the rung is the top one.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

# What an exited trial counts as in its rung: the worst value there is.
EXITED_METRIC = 1.7976931348623157e308


@dataclass(frozen=True)
class Bracket:
    """One async_halving search of an adaptive_asha search."""

    num_rungs: int
    max_trials: int
    max_concurrent_trials: int


def rung_lengths(num_rungs: int, divisor: float, max_length: int) -> list[int]:
    """The training length each rung of a bracket compares its trials at."""
    return [
        max(int(max_length / math.pow(divisor, num_rungs - i - 1)), 1) for i in range(num_rungs)
    ]


def bracket_max_trials(max_trials: int, divisor: float, bracket_rungs: Sequence[int]) -> list[int]:
    """`max_trials` shared so each bracket gets about the same total training."""
    weights = [math.pow(divisor, rungs - 1) / rungs for rungs in bracket_rungs]
    total = sum(weights)
    shares = [max(int(w / total * max_trials), 1) for w in weights]
    shares[0] += max(max_trials - sum(shares), 0)
    return shares


def bracket_max_concurrent_trials(
    max_concurrent_trials: int, divisor: float, max_trials: Sequence[int]
) -> list[int]:
    """`max_concurrent_trials` split evenly, the remainder to the first brackets; 0 gives every
    bracket max(the last bracket's trials, int(divisor))."""
    count = len(max_trials)
    if max_concurrent_trials == 0:
        shares, remainder = [max(max_trials[-1], int(divisor))] * count, 0
    else:
        total = max(max_concurrent_trials, count)
        shares, remainder = [total // count] * count, total % count
    for i in range(remainder):
        shares[i] += 1
    return shares


def bracket_rungs_for_mode(mode: str, max_rungs: int) -> list[int]:
    if mode == "aggressive":
        return [max_rungs]
    if mode == "standard":
        return list(range((max_rungs - 1) // 2 + 1, max_rungs + 1))
    if mode == "conservative":
        return list(range(1, max_rungs + 1))
    raise ValueError(f"unexpected adaptive mode {mode!r}")


def adaptive_brackets(
    *,
    max_trials: int,
    max_length: int,
    divisor: float,
    mode: str,
    max_rungs: int,
    bracket_rungs: Sequence[int],
    max_concurrent_trials: int,
) -> list[Bracket]:
    """The brackets of an adaptive_asha search, most rungs first."""
    rungs = list(bracket_rungs)
    if not rungs:
        cap = min(
            max_rungs,
            int(math.log(max_length) / math.log(divisor)) + 1,
            int(math.log(max_trials) / math.log(divisor)) + 1,
        )
        rungs = bracket_rungs_for_mode(mode, cap)
    rungs.sort(reverse=True)
    trials = bracket_max_trials(max_trials, divisor, rungs)
    concurrency = bracket_max_concurrent_trials(max_concurrent_trials, divisor, trials)
    return [Bracket(n, t, c) for n, t, c in zip(rungs, trials, concurrency, strict=True)]


def initial_trials(bracket: Bracket, divisor: float) -> int:
    """How many trials a bracket starts with (each stop then starts one more)."""
    if bracket.max_concurrent_trials > 0:
        return min(bracket.max_concurrent_trials, bracket.max_trials)
    natural = int(math.pow(divisor, bracket.num_rungs - 1))
    return min(max(1, natural), bracket.max_trials)


def insert_index(rung: Sequence[float], metric: float) -> int:
    """Where `metric` ranks in a rung's sorted metrics: before every equal or worse one."""
    return bisect.bisect_left(sorted(rung), metric)


def continues(rank: int, rung_size: int, divisor: float) -> bool:
    """Whether the trial ranked `rank` (0: best) in a rung of `rung_size` metrics, its own
    included, is among the top 1/divisor that go on."""
    return rank < max(int(rung_size / divisor), 1)
