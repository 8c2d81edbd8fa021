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


def times_out_by_ticks(pages: int, base: int, rate: int, timeout: int, cap: int | None) -> bool:
    """Send the transfer batch by batch (at most `cap` pages each, one after another), counting each one's ticks."""
    left = pages
    while left > 0:
        batch = left if cap is None else min(cap, left)
        ticks = base + len(range(0, batch, rate))  # a tick for every `rate` pages, the last one perhaps partial
        if ticks > timeout:
            return True
        left -= batch
    return False


def check_times_out(fn: Callable[[int, int, int, int, int | None], bool]) -> None:
    """fn(pages, base, rate, timeout, cap) -> whether the receiver gives up on a transfer of `pages` pages sent
    in batches of at most `cap` (None: one batch), each landing base + ceil(n / rate) ticks after it is posted."""
    rng = random.Random(40)
    cases = [(12, 1, 1, 16, None), (40, 1, 1, 16, None), (40, 1, 1, 16, 8), (39, 1, 1, 40, None),
             (40, 1, 1, 40, None), (40, 1, 2, 16, 32), (5, 3, 1, 4, 1)]
    cases += [(rng.randint(1, 80), rng.randint(0, 3), rng.randint(1, 4), rng.randint(4, 40),
               rng.choice([None, 4, 8, 16])) for _ in range(8)]
    expect_cases(fn, times_out_by_ticks, cases, "{} pages, base {}, {} pages/tick, timeout {}, cap {}",
                 "Only the slowest batch matters: does it take more than `timeout` ticks?", "correct on {} transfers")
