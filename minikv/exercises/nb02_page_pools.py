"""Checkers for notebook 02 (page pools and block tables), against the engine's own code:
`PagePool.slots` for slot mapping, `bench/memory.paged_use` for waste, `replay` for stale pages."""

import random
from typing import Callable

from minikv.bench.memory import paged_use
from minikv.engine.events import Event
from minikv.engine.page_pool import PagePool
from minikv.exercises import TINY_MODEL, expect, expect_cases
from minikv.viz.replay import PageStatus, replay

NODE = "node"  # the one node of the simulated logs


def pool_slot(block_table: list[int], page_size: int, position: int) -> int:
    """The slot the engine's page pool maps this token position to."""
    pool = PagePool(TINY_MODEL, num_pages=64, page_size=page_size)
    return pool.slots(block_table, position, position + 1)[0]


def check_slot_mapping(fn: Callable[[list[int], int, int], int]) -> None:
    """fn(block_table, page_size, position) -> the pool slot holding that token's K/V."""
    rng = random.Random(0)
    tables = [([0], 1), ([3, 0, 2], 4), ([41, 7, 19], 16)]  # scattered pages, page sizes from 1 token to 16
    for _ in range(5):
        page_size = rng.choice([2, 3, 8, 16])
        tables.append((rng.sample(range(64), rng.randint(1, 6)), page_size))
    cases = [(table, page_size, position) for table, page_size in tables
             for position in range(len(table) * page_size)]
    expect_cases(fn, pool_slot, cases, "block table {}, page size {}, position {}",
                 "Find the entry of the block table that holds the position (which page), then the offset "
                 "inside that page; a slot is page * page_size + offset.",
                 "correct on {} token positions in 8 block tables")


def wasted_slots(kv_lens: list[int], page_size: int) -> int:
    """Slots a page pool reserves for these K/V lengths but leaves empty, as the memory benchmark counts."""
    use = paged_use(kv_lens, page_size)
    return use.reserved_tokens - use.used_tokens


def check_wasted_slots(fn: Callable[[list[int], int], int]) -> None:
    """fn(kv_lens, page_size) -> slots a page pool reserves for these requests but leaves empty."""
    rng = random.Random(2)
    cases = [([1], 16), ([16], 16), ([17], 16), ([0, 5], 4), ([84, 150, 499, 512], 16),
             ([1, 2, 3, 4, 5, 6, 7, 8], 1), ([30] * 10, 32), ([100, 200, 300], 7)]
    cases += [([rng.randint(1, 600) for _ in range(rng.randint(1, 9))], rng.choice([3, 8, 16, 32]))
              for _ in range(4)]
    expect_cases(fn, wasted_slots, cases, "K/V lengths {}, page size {}", "Each request holds whole pages, "
                 "enough for its tokens (round up); only the end of its last page stays empty.",
                 "correct on {} workloads")


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
            tenant = f"tenant{request[-1]}"
            events.append(Event(3 * num_requests, NODE, "free", request, tenant, tuple(held[request])))
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
