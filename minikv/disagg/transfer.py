"""The KV transfer between the two pools, behaving like RDMA.

A transfer belongs to a *bootstrap room* (one per request) shared by a `KVSender` on the
prefill node and a `KVReceiver` on the decode node; `KVManager` is the bootstrap server that
pairs them. The protocol, with SGLang's poll states:

    receiver.init()                 Bootstrapping   (both sides register the room)
    receiver.send_metadata(pages)   WaitingForInput (decode advertises where the KV must go)
    sender.init(num_pages)          the sender sizes the transfer from *its own* input length
    sender.send(src_pages, ...)     Transferring    (page writes posted to the fabric)
    ... fabric.tick() lands them ...
    poll()                          Success, or Failed (aborted, timed out)

Page writes are posted in batches. A posted batch is a DMA already in the network: it lands
`base_latency + pages` ticks later *whatever happens to the request meanwhile*. Aborting only
stops batches not yet posted. That is how a late write can land in pages that the decode node
already gave to someone else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import torch
from torch import Tensor

from minikv.audit import OwnershipAudit
from minikv.events import Event, EventLog
from minikv.page_pool import PagePool


class KVPoll(IntEnum):
    """Transfer states, named and numbered as in SGLang's disaggregation base module."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


@dataclass
class PostedBatch:
    """Pages in flight: a snapshot of the source K/V and ledger, landing at `due_tick`."""

    room: int
    dst_pages: list[int]
    kv: Tensor  # (L, 2, n, page, KVH, D) read from the prefill pool when posted
    writers: Tensor  # (n * page,) writer uid of every source slot
    due_tick: int
    positions: Tensor | None = None  # (n * page,) the token position each source slot was written at


@dataclass
class Transfer:
    """Everything both sides of one room know."""

    room: int
    request_id: str
    tenant: str
    status: KVPoll = KVPoll.Bootstrapping
    dst_pages: list[int] | None = None  # advertised by the receiver
    num_pages: int | None = None  # sized by the sender
    unposted: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (src, dst) batches
    in_flight: int = 0  # posted batches not yet landed
    pages_landed: int = 0
    last_progress_tick: int = 0
    first_token: int | None = None
    sent_tokens: int | None = None
    checksum: int | None = None
    cached_tokens: int = 0  # prompt tokens prefill took from its prefix cache (reported in usage)
    failure: str | None = None
    failure_status: int = 500


class KVManager:
    """The bootstrap server and the fabric: rooms, posted batches, and the clock they land by."""

    def __init__(self, src: PagePool, dst: PagePool, src_audit: OwnershipAudit | None,
                 dst_audit: OwnershipAudit | None, log: EventLog, base_latency: int = 1,
                 pages_per_tick: int = 1, timeout_ticks: int = 16, batch_cap_pages: int | None = None) -> None:
        self.src, self.dst, self.src_audit, self.dst_audit, self.log = src, dst, src_audit, dst_audit, log
        self.base_latency, self.pages_per_tick = base_latency, pages_per_tick
        self.timeout_ticks, self.batch_cap_pages = timeout_ticks, batch_cap_pages
        self.rooms: dict[int, Transfer] = {}
        self.posted: list[PostedBatch] = []
        self.tick_no = 0

    def open_room(self, room: int, request_id: str, tenant: str) -> Transfer:
        assert room not in self.rooms, f"room {room} opened twice"
        self.rooms[room] = Transfer(room, request_id, tenant, last_progress_tick=self.tick_no)
        return self.rooms[room]

    def latency(self, num_pages: int) -> int:
        """Ticks a batch of `num_pages` pages takes to land."""
        return self.base_latency + -(-num_pages // self.pages_per_tick)

    # -- the sender's side (prefill) ------------------------------------------------------
    def send(self, room: int, src_pages: list[int], num_tokens: int, first_token: int, checksum: int | None,
             cached_tokens: int = 0) -> None:
        t = self.rooms[room]
        assert t.dst_pages is not None and t.num_pages is not None, "send() before the receiver's metadata"
        n = min(len(src_pages), t.num_pages)
        pairs = list(zip(src_pages[:n], t.dst_pages[:n]))
        cap = self.batch_cap_pages or max(1, n)
        t.unposted = [([s for s, _ in pairs[i : i + cap]], [d for _, d in pairs[i : i + cap]]) for i in range(0, n, cap)]
        t.sent_tokens, t.first_token, t.checksum, t.cached_tokens = num_tokens, first_token, checksum, cached_tokens
        t.status, t.last_progress_tick = KVPoll.Transferring, self.tick_no
        self._post_next(t)

    def _post_next(self, t: Transfer) -> None:
        """Post the next batch of `t`: one batch in flight per room, as a DMA queue."""
        if not t.unposted:
            return
        src_pages, dst_pages = t.unposted.pop(0)
        ps = self.src.page_size
        src_slots = torch.tensor([p * ps + o for p in src_pages for o in range(ps)], device=self.src.kv.device)
        writers = self.src_audit.writers[src_slots].clone() if self.src_audit is not None else torch.zeros(0)
        positions = self.src_audit.positions[src_slots].clone() if self.src_audit is not None else None
        batch = PostedBatch(t.room, dst_pages, self.src.kv[:, :, src_pages].clone(), writers,
                            self.tick_no + self.latency(len(src_pages)), positions)
        self.posted.append(batch)
        t.in_flight += 1
        self.log.add(Event(self.tick_no, "fabric", "post", t.request_id, t.tenant, tuple(dst_pages),
                           f"{len(src_pages)} page(s) posted, lands at tick {batch.due_tick}"))

    def abort(self, room: int, reason: str, status: int = 500) -> None:
        """Stop the transfer: nothing more is posted. Batches already posted still land."""
        t = self.rooms[room]
        if t.status in (KVPoll.Success, KVPoll.Failed):
            return
        t.unposted = []
        t.status, t.failure, t.failure_status = KVPoll.Failed, reason, status

    # -- the clock --------------------------------------------------------------------------
    def tick(self) -> None:
        """End of a tick: land every batch due by now (in posting order), check timeouts, advance."""
        due = [b for b in self.posted if b.due_tick <= self.tick_no]
        self.posted = [b for b in self.posted if b.due_tick > self.tick_no]
        for b in due:
            self._land(b)
        for t in self.rooms.values():
            if t.status is KVPoll.Transferring and self.tick_no - t.last_progress_tick >= self.timeout_ticks:
                self.abort(t.room, f"KV transfer timed out: no page landed for {self.timeout_ticks} ticks")
        self.tick_no += 1

    def _land(self, b: PostedBatch) -> None:
        t = self.rooms[b.room]
        dst = torch.tensor(b.dst_pages, device=self.dst.kv.device)
        self.dst.kv[:, :, dst] = b.kv.to(self.dst.kv.device)  # the write lands, whoever owns the pages now
        if self.dst_audit is not None:
            ps = self.dst.page_size
            slots = (dst[:, None] * ps + torch.arange(ps, device=dst.device)).flatten()
            self.dst_audit.record_writes(slots, b.writers.to(dst.device),
                                         b.positions.to(dst.device) if b.positions is not None else None)
        t.in_flight -= 1
        owners = {self.dst.owner_of(p) for p in b.dst_pages}
        late = t.status is KVPoll.Failed
        self.log.add(Event(self.tick_no, "decode", "write", t.request_id, t.tenant, tuple(b.dst_pages),
                           "KV transfer landed" + (f" LATE, in pages now owned by {sorted(o or 'nobody' for o in owners)}" if late else "")))
        if late:
            return
        t.pages_landed += len(b.dst_pages)
        t.last_progress_tick = self.tick_no
        if t.unposted:
            self._post_next(t)
        elif t.in_flight == 0:
            t.status = KVPoll.Success

    def settled(self, room: int) -> bool:
        """No write of this room is still in the network (what deferred release waits for)."""
        return self.rooms[room].in_flight == 0


class KVSender:
    """The prefill side of one room."""

    def __init__(self, manager: KVManager, room: int) -> None:
        self.manager, self.room = manager, room

    def init(self, num_pages: int) -> None:
        self.manager.rooms[self.room].num_pages = num_pages

    def send(self, kv_pages: list[int], num_tokens: int, first_token: int, checksum: int | None,
             cached_tokens: int = 0) -> None:
        self.manager.send(self.room, kv_pages, num_tokens, first_token, checksum, cached_tokens)

    def poll(self) -> KVPoll:
        t = self.manager.rooms[self.room]
        if t.status is KVPoll.Bootstrapping and t.dst_pages is not None:
            return KVPoll.WaitingForInput
        return t.status

    def abort(self, reason: str, status: int = 400) -> None:
        self.manager.abort(self.room, reason, status)


class KVReceiver:
    """The decode side of one room."""

    def __init__(self, manager: KVManager, room: int) -> None:
        self.manager, self.room = manager, room

    def send_metadata(self, kv_pages: list[int]) -> None:
        t = self.manager.rooms[self.room]
        t.dst_pages = list(kv_pages)
        t.last_progress_tick = self.manager.tick_no

    def poll(self) -> KVPoll:
        t = self.manager.rooms[self.room]
        if t.status is KVPoll.Bootstrapping and t.dst_pages is not None:
            return KVPoll.WaitingForInput
        return t.status

    @property
    def transfer(self) -> Transfer:
        return self.manager.rooms[self.room]

    def abort(self, reason: str, status: int = 500) -> None:
        self.manager.abort(self.room, reason, status)
