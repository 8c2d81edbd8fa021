"""One KV-transfer protocol, two backends: what both implement, and the endpoints nodes hold.

A transfer belongs to a *bootstrap room* (one per request) shared by a `KVSender` on the prefill
node and a `KVReceiver` on the decode node. The protocol, with SGLang's poll states:

    receiver.init()                 Bootstrapping   (both sides register the room)
    receiver.send_metadata(pages)   WaitingForInput (decode advertises where the KV must go)
    sender.init(num_pages)          the sender sizes the transfer from *its own* input length
    sender.send(src_pages, ...)     Transferring    (page writes posted to the fabric)
    ... the backend's land_due() lands them ...
    poll()                          Success, or Failed (aborted, timed out)

`KVTransfer` is the interface; two backends implement it and the same protocol tests run
against both (tests/test_transfer_protocol.py):
- inprocess.py (`KVManager`): one object holds both pools and lands posted batches on the
  cluster's clock, a set number of ticks later: deterministic, drawable, the late write on cue;
- torch_dist.py (`DistKVManager`): each process holds its half, the pages really travel between
  two processes by torch.distributed, and the bootstrap goes through a TCPStore.

Page writes are posted in batches. A posted batch is a DMA already in the network: it lands
*whatever happens to the request meanwhile*. Aborting only stops batches not yet posted. That
is how a late write can land in pages that the decode node already gave to someone else, and
why `settled(room)` (no write of it still in the network) is what deferred release waits for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from http import HTTPStatus
from typing import Protocol

import torch


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
    """One room's record. Only KVManager writes it; each endpoint supplies its part through a call.

    The receiver supplies `dst_pages` (send_metadata), the sender `num_pages` (init) and
    `shipment` (send); everything else is the fabric's own state.
    """

    room: int
    request_id: str
    tenant: str
    uid: int  # the request's writer id in both audit ledgers
    status: KVPoll = KVPoll.Bootstrapping
    dst_pages: list[int] | None = None  # advertised by the receiver
    num_pages: int | None = None  # sized by the sender
    shipment: Shipment | None = None
    unposted: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (src, dst) batches
    in_flight: int = 0  # posted batches not yet landed
    pages_landed: int = 0
    last_progress_tick: int = 0
    failure: str | None = None
    failure_status: int = HTTPStatus.INTERNAL_SERVER_ERROR
    open_sides: set[str] = field(default_factory=lambda: {"sender", "receiver"})


class KVTransfer(Protocol):
    """What a transfer backend offers the nodes (KVManager in one process, DistKVManager across two)."""

    rooms: dict[int, Transfer]  # the rooms this side still holds

    def open_room(self, room: int, request_id: str, tenant: str, uid: int) -> Transfer:
        """Register a request's room (its uid is its writer id in both audit ledgers)."""

    def poll(self, room: int) -> KVPoll:
        """The room's state as this side sees it."""

    def send_metadata(self, room: int, dst_pages: list[int]) -> None:
        """The receiver advertises where the KV must land."""

    def init_sender(self, room: int, num_pages: int) -> None:
        """The sender sizes the transfer: pages of its *own* input."""

    def send(self, room: int, src_pages: list[int], shipment: Shipment) -> None:
        """Post the pages' writes; from now on they land whatever happens to the request."""

    def abort(self, room: int, reason: str, status: int = HTTPStatus.INTERNAL_SERVER_ERROR) -> None:
        """Stop the transfer: nothing more is posted; what was posted still lands."""

    def close(self, room: int, side: str) -> None:
        """One side is done with the room; it is dropped once nothing of it is in flight."""

    def settled(self, room: int) -> bool:
        """No write of this room is still in the network."""

    def land_due(self) -> None:
        """Advance the fabric: land what has arrived, fail what timed out."""


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
        """The room's record, read-only for endpoints."""
        return self.manager.rooms[self.room]

    def abort(self, reason: str, status: int = HTTPStatus.INTERNAL_SERVER_ERROR) -> None:
        self.manager.abort(self.room, reason, status)

    def close(self) -> None:
        """This side is done with the room (its request's pages on this node are freed)."""
        if self._closed_at is None:
            self._closed_at = self.poll()
            self.manager.close(self.room, self.side)


class KVSender(KVEndpoint):
    """The prefill side of one room."""

    side = "sender"

    def init(self, num_pages: int) -> None:
        self.manager.init_sender(self.room, num_pages)

    def send(self, kv_pages: list[int], shipment: Shipment) -> None:
        self.manager.send(self.room, kv_pages, shipment)

    def abort(self, reason: str, status: int = HTTPStatus.BAD_REQUEST) -> None:
        self.manager.abort(self.room, reason, status)


class KVReceiver(KVEndpoint):
    """The decode side of one room."""

    side = "receiver"

    def send_metadata(self, kv_pages: list[int]) -> None:
        self.manager.send_metadata(self.room, kv_pages)
