"""The event log: every allocation, write, read, free and state change, in order; notebooks replay it,
tests assert on it. Each kind of event and what its fields mean: docs/engine.md, "The event log".
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Event:
    """One thing that happened on one node at one engine step."""

    step: int
    node: str
    kind: str  # submit, reject, allocate, cache_hit, write, read, cross_read, free, preempt, finish, ...
    request_id: str
    tenant: str
    pages: tuple[int, ...] = ()
    detail: str = ""

    def __str__(self) -> str:
        pages = f" pages={list(self.pages)}" if self.pages else ""
        who = f"{self.tenant}/{self.request_id}"
        return f"[{self.node} step {self.step}] {self.kind} {who}{pages} {self.detail}".rstrip()


@dataclass
class Clock:
    """The one step counter of a node or cluster: it stamps every event, and only its owner advances it."""

    now: int = 0

    def advance(self) -> None:
        self.now += 1


@dataclass
class EventLog:
    """An append-only list of events (none unless `enabled`); with `limit`, about that many recent ones."""

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
