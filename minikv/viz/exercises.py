"""A checker for the page-map exercise: find the stale pages from the event log alone.

The learner writes `stale_pages(events, num_pages) -> list[int]`: the pages that are free at the
end of a single-node log but still hold some request's data. The checker tries it on logs made
by a small simulated allocator (same free-list order as `PagePool`) and compares the answer
with `replay`, prints one line when everything passes, and raises with a hint otherwise.
"""

from __future__ import annotations

import random
from typing import Callable

from minikv.events import Event
from minikv.viz.replay import PageStatus, replay

NODE = "node"


def simulated_log(seed: int, num_pages: int = 12, num_requests: int = 8) -> list[Event]:
    """Requests take pages off a free-list stack, write some of them, and give them back."""
    rng = random.Random(seed)
    free = list(reversed(range(num_pages)))  # stack: pop() gives page 0 first, like PagePool
    held: dict[str, list[int]] = {}
    events: list[Event] = []
    for step in range(3 * num_requests):
        if held and (rng.random() < 0.4 or len(held) == num_requests):
            request = rng.choice(sorted(held))
            pages = held.pop(request)
            events.append(Event(step, NODE, "free", request, f"tenant{request[-1]}", tuple(pages)))
            free.extend(reversed(pages))
        elif free and len(events) < 6 * num_requests:
            request = f"req-{sum(1 for e in events if e.kind == 'allocate')}"
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
        got = sorted(fn(list(events), num_pages))
        assert got == want, (
            f"log #{seed} ({len(events)} events, {num_pages} pages): got {got}, want {want}. "
            "A page is stale when its last allocate was followed by a free (it has no owner) "
            "and some write put data in it at any time: free does not erase data."
        )
    print(f"correct on {len(cases)} event logs")
