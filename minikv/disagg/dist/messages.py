"""What the front door and the two worker processes tell each other (pickled over multiprocessing queues).

The KV itself never travels here: the pages go worker to worker on torch.distributed
(transfer/torch_dist.py). Here only the control plane, one typed message per kind:

    front door -> worker   Admit, Cancel, Stop
    worker -> front door   Ready, InFlight (prefill), Tokens (decode), Ended (decode), Report, WorkerFailed
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minikv.engine.request import Request, Sequence
from minikv.model.sampling import SamplingParams


@dataclass(frozen=True)
class Admit:
    """A request the front door checked, as both workers receive it; each builds its own Sequence."""

    request_id: str
    tenant: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    arrival_s: float  # time.perf_counter() in the front door (a system-wide monotonic clock on Linux)
    room: int  # also the request's uid in both audit ledgers
    client_request_id: str | None
    stop: tuple[str, ...] = ()
    cache_keys: list[bytes] = field(default_factory=list)

    @classmethod
    def of(cls, seq: Sequence) -> Admit:
        return cls(seq.request_id, seq.tenant, seq.prompt_ids, seq.max_tokens, seq.sampling, seq.arrival_s, seq.room,
                   seq.client_request_id, seq.stop, seq.cache_keys)

    def sequence(self) -> Sequence:
        request = Request("", self.tenant, self.max_tokens, self.sampling, self.client_request_id, stop=self.stop)
        return Sequence.of(request, self.request_id, self.prompt_ids, self.arrival_s, uid=self.room, room=self.room,
                           cache_keys=list(self.cache_keys))


@dataclass(frozen=True)
class Cancel:
    request_id: str


@dataclass(frozen=True)
class Stop:
    """Shut down: the worker leaves its loop and exits."""


@dataclass(frozen=True)
class Ready:
    rank: int
    startup_line: str


@dataclass(frozen=True)
class InFlight:
    """Prefill: the request's KV is posted (a cancel now races a late write)."""
    request_id: str


@dataclass(frozen=True)
class Tokens:
    """Decode: the tokens generated since the last message (what the server streams)."""
    request_id: str
    ids: list[int]


@dataclass(frozen=True)
class Ended:
    """Decode: how a request left (its Sequence travels without its sampler, which does not pickle)."""
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
