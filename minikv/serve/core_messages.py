"""What the HTTP side and the engine core tell each other (the core on a thread of this process, or in a
process of its own: the same messages either way). In: Submit, Cancel, Drain, Stop; out: Ready or
CoreFailed once, then one StepOutput a step (and a heartbeat while idle). docs/architecture.md draws both
sides."""

from dataclasses import dataclass, field

from minikv.disagg.dist.messages import Stop  # the pair's own: one Stop for every loop
from minikv.engine.request import Request, Response


@dataclass(frozen=True)
class Submit:
    """A request the HTTP side checked and tokenized; `key` names it in every message about it."""
    key: int
    request: Request
    prompt_ids: list[int]


@dataclass(frozen=True)
class Cancel:
    """The client went away: free the request's pages at the next step."""
    key: int


@dataclass(frozen=True)
class Drain:
    """SIGTERM: take no new request; end those still running with a 503 after `grace_s`."""
    grace_s: float


@dataclass(frozen=True)
class Ready:
    """The core process loaded its model and built its door: what the server prints, and the window."""
    startup_lines: list[str]
    context_len: int


@dataclass(frozen=True)
class CoreFailed:
    """The core process could not start: one line saying why."""
    reason: str


@dataclass(frozen=True)
class StepOutput:
    """One step: each live request's new token ids, the answers finished in it, and what /health shows."""
    tokens: dict[int, list[int]] = field(default_factory=dict)  # key -> ids generated in this step
    finished: list[tuple[int, Response]] = field(default_factory=list)  # (key, its one Response)
    stats: dict = field(default_factory=dict)
