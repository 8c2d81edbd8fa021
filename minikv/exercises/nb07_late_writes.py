"""Checkers for notebook 07 (late writes)."""

import random
from typing import Callable

from minikv.exercises import expect_cases
from minikv.exercises.nb04_disaggregated import batch_ticks, batches


def largest_cap_by_trial(base: int, rate: int, timeout: int) -> int:
    """Try every batch size up to what `timeout` ticks at `rate` could move, each played tick by tick."""
    return max(n for n in range(1, rate * timeout + 1) if batch_ticks(n, base, rate) <= timeout)


def check_largest_safe_cap(fn: Callable[[int, int, int], int]) -> None:
    """fn(base_latency, pages_per_tick, timeout_ticks) -> the largest batch (in pages) that lands
    before the receiver's timeout fires (a batch must land within timeout_ticks ticks)."""
    rng = random.Random(7)
    cases = [(1, 1, 16), (0, 1, 16), (1, 2, 16), (3, 1, 4), (2, 4, 10)]
    cases += [(rng.randint(0, 4), rng.randint(1, 5), rng.randint(6, 40)) for _ in range(6)]
    expect_cases(fn, largest_cap_by_trial, cases, "base {}, {} pages/tick, timeout {}",
                 "A batch of n pages lands base + ceil(n / rate) ticks after it is posted.",
                 "correct on {} fabrics")


def times_out_by_ticks(pages: int, base: int, rate: int, timeout: int, cap: int | None) -> bool:
    """Send the transfer batch by batch, counting each one's ticks: does any take longer than `timeout`?"""
    return any(batch_ticks(batch, base, rate) > timeout for batch in batches(pages, cap))


def check_times_out(fn: Callable[[int, int, int, int, int | None], bool]) -> None:
    """fn(pages, base, rate, timeout, cap) -> whether the receiver gives up on a transfer of `pages` pages
    sent in batches of at most `cap` (None: one batch), each landing base + ceil(n / rate) ticks after."""
    rng = random.Random(40)
    cases = [(12, 1, 1, 16, None), (40, 1, 1, 16, None), (40, 1, 1, 16, 8), (39, 1, 1, 40, None),
             (40, 1, 1, 40, None), (40, 1, 2, 16, 32), (5, 3, 1, 4, 1)]
    cases += [(rng.randint(1, 80), rng.randint(0, 3), rng.randint(1, 4), rng.randint(4, 40),
               rng.choice([None, 4, 8, 16])) for _ in range(8)]
    expect_cases(fn, times_out_by_ticks, cases, "{} pages, base {}, {} pages/tick, timeout {}, cap {}",
                 "Only the slowest batch matters: does it take more than `timeout` ticks?",
                 "correct on {} transfers")
