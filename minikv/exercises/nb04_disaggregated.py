"""Checkers for notebook 04 (disaggregated prefill and decode)."""

import random
from typing import Callable

from minikv.engine.page_pool import PagePool
from minikv.exercises import TINY_MODEL, expect_cases


def reserved_pages(prompt_tokens: int, max_tokens: int, page_size: int) -> int:
    """What the decode node's pool takes off its free list for such a request (the engine's own count)."""
    pool = PagePool(TINY_MODEL, num_pages=1 + (prompt_tokens + max_tokens) // page_size, page_size=page_size)
    return len(pool.allocate(pool.pages_for(prompt_tokens + max_tokens), "r"))


def check_decode_reservation(fn: Callable[[int, int, int], int]) -> None:
    """fn(prompt_tokens, max_tokens, page_size) -> pages the decode node preallocates."""
    rng = random.Random(4)
    cases = [(1, 1, 16), (16, 1, 16), (800, 48, 16), (24, 48, 16), (100, 28, 8), (5, 3, 2)]
    cases += [(rng.randint(1, 900), rng.randint(1, 64), rng.choice([4, 8, 16])) for _ in range(6)]
    expect_cases(fn, reserved_pages, cases, "prompt {}, max_tokens {}, page_size {}",
                 "Decode reserves room for the prompt AND every output token, in whole pages.",
                 "correct on {} requests")


def batches(num_pages: int, cap: int | None) -> list[int]:
    """The pages of each batch a transfer sends, one after another: at most `cap` each (None: one batch)."""
    size = cap or max(num_pages, 1)  # (no pages: no batch)
    return [min(size, num_pages - sent) for sent in range(0, num_pages, size)]


def batch_ticks(pages: int, base: int, rate: int) -> int:
    """Play one batch on the fabric tick by tick: it waits `base` ticks, then moves `rate` pages a tick."""
    ticks = base
    while pages > 0:
        pages -= rate
        ticks += 1
    return ticks


def ticks_on_the_wire(num_pages: int, cap: int | None, base: int, rate: int) -> int:
    """Ticks until the last batch lands: one batch in flight at a time."""
    return sum(batch_ticks(pages, base, rate) for pages in batches(num_pages, cap))


def check_transfer_ticks(fn: Callable[[int, int | None, int, int], int]) -> None:
    """fn(num_pages, cap, base_latency, pages_per_tick) -> ticks until the last batch lands."""
    rng = random.Random(5)
    cases = [(38, None, 1, 1), (38, 8, 1, 1), (1, None, 1, 1), (10, 4, 0, 2), (16, 16, 3, 1), (7, 3, 2, 2)]
    cases += [(rng.randint(1, 60), rng.choice([None, 4, 8, 16]), rng.randint(0, 3), rng.randint(1, 4))
              for _ in range(6)]
    expect_cases(fn, ticks_on_the_wire, cases, "{} pages, cap {}, base {}, {} pages/tick",
                 "Batches go one after another; each costs the base latency plus its pages at the rate, "
                 "rounded up.",
                 "correct on {} transfers")
