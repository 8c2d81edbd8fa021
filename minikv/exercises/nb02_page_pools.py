"""Checkers for notebook 02 (page pools and block tables).

Each checker tries a learner's function on hidden cases and compares it with the engine's own
code: `PagePool.slots` for slot mapping, `bench/memory.paged_use` for waste, and `replay` for
stale pages. It prints one line when everything passes and raises AssertionError saying what
was expected and what came back, so the exercise cell fails loudly until it is solved.
"""

from __future__ import annotations

import random
from typing import Callable

from minikv.engine.events import Event
from minikv.exercises import expect
from minikv.bench.memory import paged_use
from minikv.model.llama import ModelConfig
from minikv.engine.page_pool import PagePool
from minikv.viz.replay import PageStatus, replay

_TINY = ModelConfig(vocab_size=4, hidden_size=4, intermediate_size=4, num_layers=1, num_heads=1,
                    num_kv_heads=1, head_dim=2, max_position_embeddings=8)  # only the bookkeeping matters


def _block_tables(seed: int) -> list[tuple[list[int], int]]:
    """(block table, page size) pairs: scattered pages, page sizes from 1 token to 16."""
    rng = random.Random(seed)
    cases = [([0], 1), ([3, 0, 2], 4), ([41, 7, 19], 16)]
    for _ in range(5):
        page_size = rng.choice([2, 3, 8, 16])
        cases.append((rng.sample(range(64), rng.randint(1, 6)), page_size))
    return cases


def check_slot_mapping(fn: Callable[[list[int], int, int], int]) -> None:
    """fn(block_table, page_size, position) -> the pool slot holding that token's K/V."""
    count = 0
    for block_table, page_size in _block_tables(0):
        pool = PagePool(_TINY, num_pages=64, page_size=page_size)
        want = pool.slots(block_table, 0, len(block_table) * page_size)
        for position, slot in enumerate(want):
            expect(fn(list(block_table), page_size, position), slot,
                   f"block table {block_table}, page size {page_size}, position {position}",
                   "Find the entry of the block table that holds the position (which page), then the "
                   "offset inside that page; a slot is page * page_size + offset.")
            count += 1
    print(f"correct on {count} token positions in 8 block tables")


_WASTE_CASES = [([1], 16), ([16], 16), ([17], 16), ([0, 5], 4), ([84, 150, 499, 512], 16),
                ([1, 2, 3, 4, 5, 6, 7, 8], 1), ([30] * 10, 32), ([100, 200, 300], 7)]


def _random_workloads(seed: int, count: int = 4) -> list[tuple[list[int], int]]:
    """(K/V lengths, page size) of random workloads."""
    rng = random.Random(seed)
    return [([rng.randint(1, 600) for _ in range(rng.randint(1, 9))], rng.choice([3, 8, 16, 32])) for _ in range(count)]


_WASTE_CASES += _random_workloads(2)


def check_wasted_slots(fn: Callable[[list[int], int], int]) -> None:
    """fn(kv_lens, page_size) -> slots a page pool reserves for these requests but leaves empty."""
    for kv_lens, page_size in _WASTE_CASES:
        use = paged_use(kv_lens, page_size)
        want = use.reserved_tokens - use.used_tokens
        expect(fn(list(kv_lens), page_size), want, f"K/V lengths {kv_lens}, page size {page_size}",
               "Each request holds whole pages, enough for its tokens (round up); only the end of its last page stays empty.")
    print(f"correct on {len(_WASTE_CASES)} workloads")


NODE = "node"


def simulated_log(seed: int, num_pages: int = 12, num_requests: int = 8) -> list[Event]:
    """Requests take pages off a free-list stack, write some of them, and give them back: by a
    `free` when they finish, or by a `preempt` (notebook 03) after which they come back for new pages."""
    rng = random.Random(seed)
    free = list(reversed(range(num_pages)))  # stack: pop() gives page 0 first, like PagePool
    held: dict[str, list[int]] = {}
    preempted: list[str] = []
    events: list[Event] = []
    for step in range(3 * num_requests):
        if held and (rng.random() < 0.4 or len(held) == num_requests):
            request = rng.choice(sorted(held))
            pages = held.pop(request)
            kind = "preempt" if rng.random() < 0.3 else "free"
            events.append(Event(step, NODE, kind, request, f"tenant{request[-1]}", tuple(pages)))
            free.extend(reversed(pages))
            if kind == "preempt":
                preempted.append(request)
        elif free and len(events) < 6 * num_requests:
            fresh = f"req-{len({e.request_id for e in events if e.kind == 'allocate'})}"
            request = preempted.pop(0) if preempted and rng.random() < 0.5 else fresh
            pages = [free.pop() for _ in range(rng.randint(1, min(3, len(free))))]
            tenant = f"tenant{request[-1]}"
            held[request] = pages
            events.append(Event(step, NODE, "allocate", request, tenant, tuple(pages)))
            written = pages[: rng.randint(0, len(pages))]  # a reservation may not be written yet
            if written:
                events.append(Event(step, NODE, "write", request, tenant, tuple(written)))
    for request in sorted(held):  # the log ends as half the survivors finish
        if rng.random() < 0.5:
            events.append(Event(3 * num_requests, NODE, "free", request, f"tenant{request[-1]}", tuple(held[request])))
    return events


def check_stale_pages(fn: Callable[[list[Event], int], list[int]]) -> None:
    """fn(events, num_pages) -> sorted pages free at the end of the log that still hold data."""
    cases = [(seed, 12) for seed in range(6)] + [(99, 4)]
    for seed, num_pages in cases:
        events = simulated_log(seed, num_pages)
        want = replay(events, num_pages)[NODE].pages(PageStatus.STALE)
        got = fn(list(events), num_pages)
        expect(sorted(got) if isinstance(got, (list, tuple, set)) else got, want,
               f"log #{seed} ({len(events)} events, {num_pages} pages)",
               "Which events give a page back, and which put data in it? Giving back does not erase.")
    print(f"correct on {len(cases)} event logs")
