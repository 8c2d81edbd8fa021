"""What the front door and the two workers tell each other over multiprocessing queues: the control
plane only (the KV goes worker to worker). In: Admit, Cancel, Stop; out: Ready once, then News, or
WorkerFailed.
"""

from dataclasses import dataclass, field

from minikv.engine.request import Finished, Sequence


@dataclass(frozen=True)
class Admit:
    """A request the front door checked: the worker's own copy of its Sequence (room and uid included)."""
    seq: Sequence


@dataclass(frozen=True)
class Cancel:
    request_id: str


@dataclass(frozen=True)
class Stop:
    """Shut down: the loop answers what is left, leaves, and its process exits (a pair's worker, the engine
    core)."""


@dataclass(frozen=True)
class Ready:
    rank: int
    startup_line: str


@dataclass(frozen=True)
class News:
    """A worker's step, sent on every change and at least every HEARTBEAT_S: its `Node.report()`, and from
    decode the tokens generated since its last News (what the server streams) and how requests left."""
    rank: int
    report: dict
    tokens: dict[str, list[int]] = field(default_factory=dict)  # request id -> its new token ids
    ended: list[Finished] = field(default_factory=list)


@dataclass(frozen=True)
class WorkerFailed:
    """The worker failed and is exiting; the text is its error."""
    rank: int
    text: str
