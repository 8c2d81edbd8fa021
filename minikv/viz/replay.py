"""Every pool's state at any point of an engine's history, rebuilt from its event log alone: pure,
so the pictures (which draw only a `PoolState`) are tested on hand-written events. docs/pictures.md."""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from minikv.engine.events import Event, EventLog

FrameMode = Literal["changes", "all", "steps"]
Holder = tuple[str, str, bool]  # (request id, tenant, took the page from the prefix cache)
UNWRITTEN_VICTIM = "victim=never-written"  # a cross_read event's detail when nobody had written the slots


def reads_unwritten(event: Event) -> bool:
    """Whether a cross_read event is a read of memory nobody wrote (not of another request's data)."""
    return event.kind == "cross_read" and event.detail == UNWRITTEN_VICTIM


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
    ref_count: tuple[int, ...]  # requests holding each page (prefix caching shares pages)
    shared: frozenset[int]  # held pages some holder took from the prefix cache
    block_tables: Mapping[str, tuple[int, ...]]  # request id -> its pages on this node, in order
    written_now: frozenset[int]  # pages written during the current step
    cross_read_now: frozenset[int]  # pages whose other request's data was read during the current step
    cross_read_ever: frozenset[int]  # pages whose other request's data was read at any step so far
    unwritten_read_now: frozenset[int] = frozenset()  # pages read, nobody having written them, this step
    unwritten_read_ever: frozenset[int] = frozenset()  # ... at any step so far

    def status(self, page: int) -> PageStatus:
        if self.owner[page] is None:
            return PageStatus.NEVER_WRITTEN if self.writer[page] is None else PageStatus.STALE
        if page in self.shared:
            return PageStatus.SHARED
        return PageStatus.OWNED if self.writer[page] == self.owner[page] else PageStatus.RESERVED

    def pages(self, status: PageStatus) -> list[int]:
        """Every page in `status`, in page order."""
        return [p for p in range(self.num_pages) if self.status(p) is status]


class PoolReplay:
    """One node's pool while the log's events are applied to it in order."""

    def __init__(self, node: str, num_pages: int) -> None:
        self.node, self.num_pages = node, num_pages
        self.holders: list[list[Holder]] = [[] for _ in range(num_pages)]
        self.writers: list[tuple[str, str] | None] = [None] * num_pages  # (request id, tenant) of the data
        self.tables: dict[str, list[int]] = {}
        self.written_now: set[int] = set()
        self.cross_now: set[int] = set()
        self.cross_ever: set[int] = set()
        self.unwritten_now: set[int] = set()
        self.unwritten_ever: set[int] = set()

    def apply(self, e: Event, now: bool) -> None:
        """Apply one of this node's events; `now` when it belongs to the step on show."""
        for p in e.pages:
            if not 0 <= p < self.num_pages:
                raise ValueError(f"event {e} names page {p}, but node {e.node!r} has {self.num_pages} pages")
        if e.kind in ("allocate", "cache_hit"):
            for p in e.pages:
                if e.kind == "allocate":
                    self.holders[p] = []  # a fresh page (or a buggy engine's double hand-out)
                self.holders[p].append((e.request_id, e.tenant, e.kind == "cache_hit"))
            self.tables.setdefault(e.request_id, []).extend(e.pages)
        elif e.kind in ("free", "preempt"):
            for p in e.pages:  # a buggy engine may free what it no longer holds: then nothing changes
                self.holders[p] = [h for h in self.holders[p] if h[0] != e.request_id]
            kept = [p for p in self.tables.pop(e.request_id, []) if p not in e.pages]
            if kept:
                self.tables[e.request_id] = kept
        elif e.kind == "write":
            for p in e.pages:
                self.writers[p] = (e.request_id, e.tenant)
            if now:
                self.written_now.update(e.pages)
        elif e.kind == "cross_read":
            ever, current = (self.unwritten_ever, self.unwritten_now) if reads_unwritten(e) else \
                (self.cross_ever, self.cross_now)
            ever.update(e.pages)
            if now:
                current.update(e.pages)

    def state(self) -> PoolState:
        first = [h[0] if h else (None, None, False) for h in self.holders]  # each page's first holder
        data = [w or (None, None) for w in self.writers]
        return PoolState(
            node=self.node, num_pages=self.num_pages, owner=tuple(h[0] for h in first),
            owner_tenant=tuple(h[1] for h in first), writer=tuple(w[0] for w in data),
            writer_tenant=tuple(w[1] for w in data), ref_count=tuple(len(h) for h in self.holders),
            shared=frozenset(p for p, held in enumerate(self.holders) if any(hit for _, _, hit in held)),
            block_tables={r: tuple(t) for r, t in self.tables.items()}, written_now=frozenset(self.written_now),
            cross_read_now=frozenset(self.cross_now), cross_read_ever=frozenset(self.cross_ever),
            unwritten_read_now=frozenset(self.unwritten_now),
            unwritten_read_ever=frozenset(self.unwritten_ever))


def as_events(log: EventLog | Iterable[Event]) -> list[Event]:
    """The events of a log, or of any iterable of events, as a list."""
    return list(log.events if isinstance(log, EventLog) else log)


def pool_sizes(events: Sequence[Event], num_pages: int | Mapping[str, int]) -> dict[str, int]:
    """Pages per node: a mapping as given, or one size for every node named in the events."""
    if isinstance(num_pages, Mapping):
        return dict(num_pages)  # events of other nodes (the front door, the fabric) hold no pool
    return {node: num_pages for node in dict.fromkeys(e.node for e in events) or ["node"]}


def replay(log: EventLog | Iterable[Event], num_pages: int | Mapping[str, int],
           upto: int | None = None) -> dict[str, PoolState]:
    """The state of every node's pool after events[0..upto] (all when None; -1: at boot); `num_pages`:
    one size for every node, or one per node (e.g. {"prefill": 42, "decode": 125})."""
    events = as_events(log)
    last = len(events) - 1 if upto is None else upto
    if not -1 <= last < len(events):
        raise IndexError(f"upto={upto} is outside the log's {len(events)} events (use -1 .. {len(events) - 1})")
    pools = {node: PoolReplay(node, size) for node, size in pool_sizes(events, num_pages).items()}
    now_step = events[last].step if last >= 0 else None
    for e in events[: last + 1]:
        if e.node in pools:
            pools[e.node].apply(e, e.step == now_step)
    return {node: pool.state() for node, pool in pools.items()}


def frame_indices(log: EventLog | Iterable[Event], mode: FrameMode = "changes") -> list[int]:
    """Which events a step-through shows, as indices into the log (the modes: docs/pictures.md)."""
    events = as_events(log)
    if mode == "all":
        return list(range(len(events)))
    if mode == "steps":
        return [i for i, e in enumerate(events) if i + 1 == len(events) or events[i + 1].step != e.step]
    if mode != "changes":
        raise ValueError(f"mode must be 'changes', 'all' or 'steps', got {mode!r}")
    frames, writer = [], {}
    for i, e in enumerate(events):
        if e.kind == "write":
            before = [writer.get((e.node, p)) for p in e.pages]
            writer |= {(e.node, p): e.request_id for p in e.pages}
            if all(w == e.request_id for w in before):
                continue  # a request writing into its own pages again changes nothing drawn
        if e.kind != "read":
            frames.append(i)
    return frames


def find_event(log: EventLog | Iterable[Event], kind: str, request_id: str | None = None,
               tenant: str | None = None, node: str | None = None, nth: int = 0) -> int:
    """Index of the `nth` (0-based; -1 for the last) event of `kind` matching the filters given."""
    hits = [i for i, e in enumerate(as_events(log)) if e.kind == kind and request_id in (None, e.request_id)
            and tenant in (None, e.tenant) and node in (None, e.node)]
    if not -len(hits) <= nth < len(hits):
        raise LookupError(f"the log has {len(hits)} {kind!r} event(s) matching request_id={request_id!r}, "
                          f"tenant={tenant!r}, node={node!r}; asked for number {nth}")
    return hits[nth]
