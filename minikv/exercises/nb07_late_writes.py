"""Checkers for notebook 07 (late writes)."""

import random
from typing import Callable

from minikv.exercises import expect_cases


def largest_cap_by_trial(base: int, rate: int, timeout: int) -> int:
    """Try every batch size: a batch of n pages lands base + ceil(n / rate) ticks after it is posted."""
    return max(n for n in range(1, 10_000) if base + -(-n // rate) <= timeout)


def check_largest_safe_cap(fn: Callable[[int, int, int], int]) -> None:
    """fn(base_latency, pages_per_tick, timeout_ticks) -> the largest batch (in pages) that lands
    before the receiver's timeout fires (a batch must land within timeout_ticks ticks)."""
    rng = random.Random(7)
    cases = [(1, 1, 16), (0, 1, 16), (1, 2, 16), (3, 1, 4), (2, 4, 10)]
    cases += [(rng.randint(0, 4), rng.randint(1, 5), rng.randint(6, 40)) for _ in range(6)]
    expect_cases(fn, largest_cap_by_trial, cases, "base {}, {} pages/tick, timeout {}",
                 "A batch of n pages lands base + ceil(n / rate) ticks after it is posted.", "correct on {} fabrics")
