"""The event log: every allocation, write, read, free and state change, in order.

Notebooks and widgets replay it to show what the engine did step by step; tests assert on it.

Event kinds and what their fields mean:
- submit / reject: a request arrived / was answered 400 at the door (detail: the reason);
- allocate: `pages` were taken off the free list for the request (it now owns them);
- cache_hit: the request took `pages` from the prefix cache (one more reference each) for the
  start of its prompt, instead of computing them; detail: how many prompt tokens that is;
- write: the request's K/V were written into `pages` (by a forward, or by a KV transfer);
- read: the request attended over `pages` (its block table, in order);
- cross_read: the audit saw the request read slots written by someone else; detail names the
  victim as "victim=<tenant>/<request id>" (or "victim=never-written");
- free: `pages` went back to the free list, data intact; preempt: the same, to recompute later;
- finish / cancel: the request left (detail: why);
- stage: the request moved to a queue stage (detail: the stage name, e.g. "prefill.bootstrap").
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Event:
    """One thing that happened on one node at one engine step."""

    step: int
    node: str
    kind: str  # submit, reject, admit, allocate, write, read, free, finish, preempt, cancel, ...
    request_id: str
    tenant: str
    pages: tuple[int, ...] = ()
    detail: str = ""

    def __str__(self) -> str:
        pages = f" pages={list(self.pages)}" if self.pages else ""
        return f"[{self.node} step {self.step}] {self.kind} {self.tenant}/{self.request_id}{pages} {self.detail}".rstrip()


@dataclass
class Clock:
    """The one step counter of a node or cluster: it stamps every event, and only its owner advances it."""

    now: int = 0

    def advance(self) -> None:
        self.now += 1


@dataclass
class EventLog:
    """An append-only list of events.

    `enabled=False` keeps benchmarks and servers free of the cost. `limit` bounds a long run's
    memory: once the log holds twice `limit` events, the oldest are dropped so `limit` remain
    (notebooks keep the default, the whole history).
    """

    enabled: bool = True
    events: list[Event] = field(default_factory=list)
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be a positive number of events, or None, got {self.limit!r}")

    def add(self, event: Event) -> None:
        if not self.enabled:
            return
        self.events.append(event)
        if self.limit is not None and len(self.events) >= 2 * self.limit:
            del self.events[: len(self.events) - self.limit]

    def of_kind(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    def for_request(self, request_id: str) -> list[Event]:
        return [e for e in self.events if e.request_id == request_id]
