"""One KV-transfer protocol, two backends: the room's record, what both backends share, and the
`KVSender` / `KVReceiver` endpoints the nodes hold, through SGLang's poll states. A posted batch
lands whatever happens to the request meanwhile (the protocol step by step: docs/disagg.md).
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import IntEnum
from http import HTTPStatus

import torch
from torch import Tensor

from minikv.engine.audit import OwnershipAudit
from minikv.engine.page_pool import PagePool


class KVPoll(IntEnum):
    """Transfer states, named and numbered as in SGLang's disaggregation base module."""
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


@dataclass(frozen=True)
class Shipment:
    """What the sender says it sent, fixed when it sends: the receiver checks against it."""
    num_tokens: int  # tokens whose KV the sender holds (its own input length)
    first_token: int  # the token prefill sampled from the prompt's last position
    checksum: int | None  # Adler-32 of that KV, when kv_checksum is on
    sampler_state: torch.Tensor | None = None  # the request's generator after the first token, when sampling
    cached_tokens: int = 0  # prompt tokens prefill took from its prefix cache (reported in usage)


@dataclass
class Transfer:
    """A room's record, written by its backend: the receiver's `dst_pages`, the sender's size and shipment."""
    room: int
    request_id: str
    tenant: str
    uid: int  # the request's writer id in both audit ledgers
    open_sides: set[str]  # the endpoints of this room not closed yet (on this side of the network)
    status: KVPoll = KVPoll.Bootstrapping
    dst_pages: list[int] | None = None  # advertised by the receiver
    num_pages: int | None = None  # sized by the sender
    shipment: Shipment | None = None
    unposted: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (src, dst) batches
    in_flight: int = 0  # posted batches not yet landed
    last_progress: float = 0.0  # last page moved: clock ticks in-process, monotonic seconds across processes
    failure: str | None = None
    failure_status: int = HTTPStatus.INTERNAL_SERVER_ERROR

    def fail(self, reason: str, status: int) -> None:
        """Mark the room Failed, unless it already ended: nothing more of it is posted."""
        if self.status not in (KVPoll.Success, KVPoll.Failed):
            self.unposted = []
            self.status = KVPoll.Failed
            self.failure, self.failure_status = reason, int(status)


def page_slots(pool: PagePool, pages: list[int]) -> Tensor:
    """Every slot of `pages`, page by page: (n * page,)."""
    slots = pool.slots(pages, 0, len(pages) * pool.page_size)
    return torch.tensor(slots, device=pool.kv.device, dtype=torch.long)


def read_pages(pool: PagePool, audit: OwnershipAudit | None, pages: list[int]) -> tuple[Tensor, Tensor]:
    """A snapshot of `pages`: their K/V (L, 2, n, page, KVH, D) and writer ledger (2, n * page), the
    writer uid and position of every slot (-1 without an audit)."""
    slots = page_slots(pool, pages)
    ledger = (torch.stack([audit.writers[slots], audit.positions[slots]]) if audit is not None
              else torch.full((2, slots.numel()), -1, dtype=torch.long))
    return pool.kv[:, :, pages], ledger  # indexing with a list copies


def write_pages(pool: PagePool, audit: OwnershipAudit | None, pages: list[int], kv: Tensor,
                ledger: Tensor) -> None:
    """A write lands in `pages`, whoever owns them now, and the audit records who wrote each slot."""
    pool.write(pages, kv)
    if audit is not None:
        ledger = ledger.to(pool.kv.device)
        audit.record_writes(page_slots(pool, pages), ledger[0], ledger[1])


class KVTransfer(ABC):
    """A transfer backend as the nodes use it (KVManager in one process, DistKVManager across two):
    `sides` are the endpoints it holds, `audits` the ledgers a dropped room's uid leaves."""

    def __init__(self, sides: tuple[str, ...], audits: tuple[OwnershipAudit | None, ...],
                 batch_cap_pages: int | None) -> None:
        self.sides, self.batch_cap_pages = sides, batch_cap_pages
        self.audits = [a for a in audits if a is not None]
        self.rooms: dict[int, Transfer] = {}  # the rooms this side still holds

    def send_metadata(self, room: int, dst_pages: list[int]) -> None:
        """The receiver advertises where the KV must land."""
        self.rooms[room].dst_pages = list(dst_pages)

    @abstractmethod
    def send(self, room: int, src_pages: list[int], shipment: Shipment) -> None:
        """Post the pages' writes; from now on they land whatever happens to the request."""

    @abstractmethod
    def land_due(self) -> None:
        """Advance the fabric: land what has arrived, fail what timed out."""

    def poll(self, room: int) -> KVPoll:
        """The room's state as this side sees it (after `_refresh` reads what the other side decided)."""
        t = self.rooms[room]
        self._refresh(t)
        if t.status is KVPoll.Bootstrapping and t.dst_pages is not None:
            return KVPoll.WaitingForInput
        return t.status

    def _refresh(self, t: Transfer) -> None:
        """Learn what the other side decided about `t`; one backend holding both sides knows already."""

    def settled(self, room: int) -> bool:
        """No write of this room is still in the network (what deferred release waits for)."""
        return room not in self.rooms or self.rooms[room].in_flight == 0

    def open_room(self, room: int, request_id: str, tenant: str, uid: int) -> None:
        """Register a request's room; a backend that holds both sides is told by both nodes."""
        if room not in self.rooms:
            self.rooms[room] = Transfer(room, request_id, tenant, uid, set(self.sides))
        assert (self.rooms[room].request_id, self.rooms[room].uid) == (request_id, uid), f"room {room} reused"

    def batches(self, t: Transfer, src_pages: list[int]) -> list[tuple[list[int], list[int]]]:
        """A send's (source, destination) page batches: the sender's `num_pages`, cut at batch_cap_pages."""
        assert t.dst_pages is not None and t.num_pages is not None, "send() before the receiver's metadata"
        n = min(len(src_pages), t.num_pages, len(t.dst_pages))
        src, dst, cap = src_pages[:n], t.dst_pages[:n], self.batch_cap_pages or max(1, n)
        return [(src[i : i + cap], dst[i : i + cap]) for i in range(0, n, cap)]

    def abort(self, room: int, reason: str, status: int = HTTPStatus.INTERNAL_SERVER_ERROR) -> None:
        """Stop the transfer: nothing more is posted; what was posted still lands."""
        self.rooms[room].fail(reason, status)

    def close(self, room: int, side: str) -> None:
        """One side is done with the room; it is dropped once nothing of it is in flight."""
        self.rooms[room].open_sides.discard(side)
        self._drop_if_done(room)

    def _drop_if_done(self, room: int) -> None:
        """Drop the room once each side here closed and nothing is in flight; its uid leaves the audits."""
        t = self.rooms[room]
        if not t.open_sides and not t.in_flight:
            del self.rooms[room]
            for audit in self.audits:
                audit.retire(t.uid)


class KVEndpoint:
    """One side of a room. Both sides poll the same way; a closed side remembers how it ended."""
    side = "endpoint"

    def __init__(self, manager: KVTransfer, room: int) -> None:
        self.manager, self.room = manager, room
        self._closed_at: KVPoll | None = None

    def poll(self) -> KVPoll:
        return self._closed_at if self._closed_at is not None else self.manager.poll(self.room)

    @property
    def transfer(self) -> Transfer:
        return self.manager.rooms[self.room]

    def failure(self) -> tuple[int, str] | None:
        """(status, reason) once the transfer failed; None while it has not."""
        return (self.transfer.failure_status, self.transfer.failure) if self.poll() is KVPoll.Failed else None

    def abort(self, reason: str, status: int) -> None:
        self.manager.abort(self.room, reason, status)

    def close(self) -> None:
        if self._closed_at is None:
            self._closed_at = self.poll()
            self.manager.close(self.room, self.side)


class KVSender(KVEndpoint):
    """The prefill side of one room."""
    side = "sender"

    def init(self, num_pages: int) -> None:
        """Size the transfer: the pages of the sender's *own* input."""
        self.transfer.num_pages = num_pages

    def send(self, kv_pages: list[int], shipment: Shipment) -> None:
        self.manager.send(self.room, kv_pages, shipment)


class KVReceiver(KVEndpoint):
    """The decode side of one room."""
    side = "receiver"

    def send_metadata(self, kv_pages: list[int]) -> None:
        self.manager.send_metadata(self.room, kv_pages)
