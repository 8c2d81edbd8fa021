"""Checkers for notebook 07 (late writes).
"""

from __future__ import annotations

import random
from typing import Callable

from minikv.exercises import expect


def check_largest_safe_cap(fn: Callable[[int, int, int], int]) -> None:
    """fn(base_latency, pages_per_tick, timeout_ticks) -> the largest batch (in pages) that lands
    before the receiver's timeout fires (a batch must land within timeout_ticks ticks)."""
    rng = random.Random(7)
    cases = [(1, 1, 16), (0, 1, 16), (1, 2, 16), (3, 1, 4), (2, 4, 10)]
    cases += [(rng.randint(0, 4), rng.randint(1, 5), rng.randint(6, 40)) for _ in range(6)]
    for base, rate, timeout in cases:
        want = max(n for n in range(1, 10_000) if base + -(-n // rate) <= timeout)  # try every batch size
        expect(fn(base, rate, timeout), want, f"base {base}, {rate} pages/tick, timeout {timeout}",
               "A batch of n pages lands base + ceil(n / rate) ticks after it is posted.")
    print(f"correct on {len(cases)} fabrics")
