"""Rebuild a pool's state at any point of an engine's history from its event log alone.

The engine's `EventLog` records every allocation, write, read and free. Replaying a prefix of it
gives, for every page of every node: who holds it now (`allocate` or `cache_hit` .. `free`/`preempt`;
with prefix caching several requests can hold one page, and `ref_count` counts them), who
last wrote into it (`write`: a forward pass or a KV transfer), and whether it was read across
tenants (`cross_read`). Pictures and widgets only ever draw a `PoolState`; this module is pure
(no plotting, no engine), so the replay can be tested on a hand-written list of events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from minikv.engine.events import Event, EventLog

FrameMode = Literal["changes", "all", "steps"]


class PageStatus(Enum):
    OWNED = "owned"  # held by a request that wrote its data there itself
    RESERVED = "reserved"  # held by a request, but the data in it is someone else's (or none)
    STALE = "stale"  # free, still holding its last writer's data (pages are not zeroed)
    NEVER_WRITTEN = "never written"  # free, nobody has written it since boot
    SHARED = "shared"  # held through the prefix cache: K/V another request computed for the same tokens


@dataclass(frozen=True)
class PoolState:
    """One node's pages after a prefix of the event log."""

    node: str
    num_pages: int
    owner: tuple[str | None, ...]  # request id holding each page, None when free
    owner_tenant: tuple[str | None, ...]
    writer: tuple[str | None, ...]  # request id whose K/V the page holds, None if never written
    writer_tenant: tuple[str | None, ...]
    block_tables: Mapping[str, tuple[int, ...]]  # request id -> its pages on this node, in order
    written_now: frozenset[int]  # pages written during the current step
    cross_read_now: frozenset[int]  # pages read across requests during the current step
    cross_read_ever: frozenset[int]  # pages read across requests at any step so far
    ref_count: tuple[int, ...] = ()  # requests holding each page (empty: one owner at most, as before)
    shared: frozenset[int] = frozenset()  # held pages some holder took from the prefix cache

    def status(self, page: int) -> PageStatus:
        if self.owner[page] is None:
            return PageStatus.NEVER_WRITTEN if self.writer[page] is None else PageStatus.STALE
        if page in self.shared:
            return PageStatus.SHARED
        return PageStatus.OWNED if self.writer[page] == self.owner[page] else PageStatus.RESERVED

    def pages(self, status: PageStatus) -> list[int]:
        """Every page in `status`, in page order."""
        return [p for p in range(self.num_pages) if self.status(p) is status]


def as_events(log: EventLog | Iterable[Event]) -> list[Event]:
    """The events of a log, or of any iterable of events, as a list."""
    return list(log.events if isinstance(log, EventLog) else log)


def pool_sizes(events: Sequence[Event], num_pages: int | Mapping[str, int]) -> dict[str, int]:
    """Pages per node: a mapping as given, or one size for every node named in the events."""
    if isinstance(num_pages, Mapping):
        return dict(num_pages)  # events of other nodes (the front door, the fabric) hold no pool
    nodes = list(dict.fromkeys(e.node for e in events)) or ["node"]
    return {node: num_pages for node in nodes}


def replay(log: EventLog | Iterable[Event], num_pages: int | Mapping[str, int],
           upto: int | None = None) -> dict[str, PoolState]:
    """The state of every node's pool after events[0..upto] (all events when upto is None).

    `upto=-1` gives the pools at boot. `num_pages` is one size for every node, or a size per
    node name (e.g. {"prefill": 42, "decode": 125}).
    """
    events = as_events(log)
    sizes = pool_sizes(events, num_pages)
    last = len(events) - 1 if upto is None else upto
    if not -1 <= last < len(events):
        raise IndexError(f"upto={upto} is outside the log's {len(events)} events (use -1 .. {len(events) - 1})")
    holders: dict[str, list[list[tuple[str, str, bool]]]] = {n: [[] for _ in range(size)] for n, size in sizes.items()}
    # each holder: (request id, tenant, took the page from the prefix cache)
    writer = {n: [None] * size for n, size in sizes.items()}
    writer_tenant = {n: [None] * size for n, size in sizes.items()}
    tables: dict[str, dict[str, list[int]]] = {n: {} for n in sizes}
    now_step = events[last].step if last >= 0 else None
    written_now: dict[str, set[int]] = {n: set() for n in sizes}
    cross_now: dict[str, set[int]] = {n: set() for n in sizes}
    cross_ever: dict[str, set[int]] = {n: set() for n in sizes}
    for e in events[: last + 1]:
        if e.node not in sizes:
            continue
        for p in e.pages:
            if not 0 <= p < sizes[e.node]:
                raise ValueError(f"event {e} names page {p}, but node {e.node!r} has {sizes[e.node]} pages")
        if e.kind in ("allocate", "cache_hit"):
            for p in e.pages:
                if e.kind == "allocate":
                    holders[e.node][p] = []  # a fresh page (or a buggy engine's double hand-out)
                holders[e.node][p].append((e.request_id, e.tenant, e.kind == "cache_hit"))
            tables[e.node].setdefault(e.request_id, []).extend(e.pages)
        elif e.kind in ("free", "preempt"):
            for p in e.pages:  # a buggy engine may free what it no longer holds: then nothing changes
                holders[e.node][p] = [h for h in holders[e.node][p] if h[0] != e.request_id]
            table = tables[e.node].get(e.request_id, [])
            tables[e.node][e.request_id] = [p for p in table if p not in e.pages]
            if not tables[e.node][e.request_id]:
                del tables[e.node][e.request_id]
        elif e.kind == "write":
            for p in e.pages:
                writer[e.node][p], writer_tenant[e.node][p] = e.request_id, e.tenant
            if e.step == now_step:
                written_now[e.node].update(e.pages)
        elif e.kind == "cross_read":
            cross_ever[e.node].update(e.pages)
            if e.step == now_step:
                cross_now[e.node].update(e.pages)
    return {
        n: PoolState(
            node=n, num_pages=sizes[n], owner=tuple(h[0][0] if h else None for h in holders[n]),
            owner_tenant=tuple(h[0][1] if h else None for h in holders[n]),
            writer=tuple(writer[n]), writer_tenant=tuple(writer_tenant[n]),
            block_tables={r: tuple(t) for r, t in tables[n].items()},
            written_now=frozenset(written_now[n]), cross_read_now=frozenset(cross_now[n]),
            cross_read_ever=frozenset(cross_ever[n]), ref_count=tuple(len(h) for h in holders[n]),
            shared=frozenset(p for p, h in enumerate(holders[n]) if any(hit for _, _, hit in h)),
        )
        for n in sizes
    }


def frame_indices(log: EventLog | Iterable[Event], mode: FrameMode = "changes") -> list[int]:
    """Which events a step-through shows, as indices into the log.

    - "all": every event;
    - "changes": every event that changes the picture or the queues: all kinds but `read`, and
      a `write` only when it puts a request's data into a page that held someone else's (so a
      decode step that appends to a page it already wrote is skipped);
    - "steps": the last event of every engine step.
    """
    events = as_events(log)
    if mode == "all":
        return list(range(len(events)))
    if mode == "steps":
        return [i for i, e in enumerate(events) if i + 1 == len(events) or events[i + 1].step != e.step]
    if mode != "changes":
        raise ValueError(f"mode must be 'changes', 'all' or 'steps', got {mode!r}")
    frames, writer = [], {}
    for i, e in enumerate(events):
        if e.kind == "read":
            continue
        if e.kind == "write":
            before = [writer.get((e.node, p)) for p in e.pages]
            for p in e.pages:
                writer[(e.node, p)] = e.request_id
            if all(w == e.request_id for w in before):
                continue
        frames.append(i)
    return frames


def find_event(log: EventLog | Iterable[Event], kind: str, request_id: str | None = None,
               tenant: str | None = None, node: str | None = None, nth: int = 0) -> int:
    """Index of the `nth` (0-based; -1 for the last) event of `kind` matching the filters given."""
    events = as_events(log)
    hits = [i for i, e in enumerate(events)
            if e.kind == kind and request_id in (None, e.request_id) and tenant in (None, e.tenant) and node in (None, e.node)]
    if not hits or not -len(hits) <= nth < len(hits):
        raise LookupError(f"the log has {len(hits)} {kind!r} event(s) matching request_id={request_id!r}, "
                          f"tenant={tenant!r}, node={node!r}; asked for number {nth}")
    return hits[nth]
