"""Checkers for notebook 07 (late writes).
"""

from __future__ import annotations

from typing import Callable


def check_largest_safe_cap(fn: Callable[[int, int, int], int]) -> None:
    """fn(base_latency, pages_per_tick, timeout_ticks) -> the largest batch (in pages) that lands
    before the receiver's timeout fires (a batch must land within timeout_ticks ticks)."""
    cases = [(1, 1, 16), (0, 1, 16), (1, 2, 16), (3, 1, 4), (2, 4, 10)]
    for base, rate, timeout in cases:
        want = max(n for n in range(1, 10_000) if base + -(-n // rate) <= timeout)
        got = fn(base, rate, timeout)
        assert got == want, f"base {base}, {rate} pages/tick, timeout {timeout}: got {got}, want {want}"
    print(f"correct on {len(cases)} fabrics")
