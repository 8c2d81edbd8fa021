"""What the front door and the two workers tell each other over multiprocessing queues: the control
plane only (the KV goes worker to worker). In: Admit, Cancel, Stop; out: Ready, Tokens, Ended,
Report, WorkerFailed.
"""

from dataclasses import dataclass

from minikv.engine.request import Sequence


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
class Tokens:
    """Decode: the tokens generated since the last message (what the server streams)."""
    request_id: str
    ids: list[int]


@dataclass(frozen=True)
class Ended:
    """Decode: how a request left."""
    seq: Sequence
    status: int
    error: str | None


@dataclass(frozen=True)
class Report:
    """A worker's pool occupancy and what its audit saw, after every change."""
    rank: int
    report: dict


@dataclass(frozen=True)
class WorkerFailed:
    """The worker failed and is exiting; the text is its error."""
    rank: int
    text: str
