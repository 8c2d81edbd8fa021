"""The in-process backend of the KV transfer (base.py): a fabric behaving like RDMA, on one clock.

`KVManager` is the bootstrap server and the fabric at once: it holds both pools, and a posted
batch lands `base_latency + pages` ticks of the cluster's clock later, whatever happens to the
request meanwhile (the notebooks', the fuzzer's and `Cluster`'s backend).
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

import torch
from torch import Tensor

from minikv.disagg.transfer.base import KVPoll, Shipment, Transfer
from minikv.engine.audit import OwnershipAudit
from minikv.engine.events import Clock, Event, EventLog
from minikv.engine.page_pool import PagePool


@dataclass
class PostedBatch:
    """Pages in flight: a snapshot of the source K/V and ledger, landing at `due_tick`."""

    room: int
    dst_pages: list[int]
    kv: Tensor  # (L, 2, n, page, KVH, D) read from the prefill pool when posted
    writers: Tensor  # (n * page,) writer uid of every source slot
    due_tick: int
    positions: Tensor | None = None  # (n * page,) the token position each source slot was written at


class KVManager:
    """The bootstrap server and the fabric: rooms, posted batches, and the cluster's clock they land by.

    A room lives from `open_room` until both endpoints are closed and no batch of it is still
    in the network; then it is dropped, and its request's name leaves the audit ledgers.
    """

    def __init__(self, src: PagePool, dst: PagePool, src_audit: OwnershipAudit | None,
                 dst_audit: OwnershipAudit | None, log: EventLog, clock: Clock, base_latency: int = 1,
                 pages_per_tick: int = 1, timeout_ticks: int = 16, batch_cap_pages: int | None = None) -> None:
        self.src, self.dst, self.src_audit, self.dst_audit, self.log = src, dst, src_audit, dst_audit, log
        self.clock = clock
        self.base_latency, self.pages_per_tick = base_latency, pages_per_tick
        self.timeout_ticks, self.batch_cap_pages = timeout_ticks, batch_cap_pages
        self.rooms: dict[int, Transfer] = {}
        self.posted: list[PostedBatch] = []

    def open_room(self, room: int, request_id: str, tenant: str, uid: int) -> Transfer:
        assert room not in self.rooms, f"room {room} opened twice"
        self.rooms[room] = Transfer(room, request_id, tenant, uid, last_progress_tick=self.clock.now)
        return self.rooms[room]

    def latency(self, num_pages: int) -> int:
        """Ticks a batch of `num_pages` pages takes to land."""
        return self.base_latency + -(-num_pages // self.pages_per_tick)

    def poll(self, room: int) -> KVPoll:
        """The room's state as both endpoints see it."""
        t = self.rooms[room]
        if t.status is KVPoll.Bootstrapping and t.dst_pages is not None:
            return KVPoll.WaitingForInput
        return t.status

    # -- the receiver's side (decode) -------------------------------------------------------
    def send_metadata(self, room: int, dst_pages: list[int]) -> None:
        t = self.rooms[room]
        t.dst_pages, t.last_progress_tick = list(dst_pages), self.clock.now

    # -- the sender's side (prefill) ------------------------------------------------------
    def init_sender(self, room: int, num_pages: int) -> None:
        self.rooms[room].num_pages = num_pages

    def send(self, room: int, src_pages: list[int], shipment: Shipment) -> None:
        t = self.rooms[room]
        assert t.dst_pages is not None and t.num_pages is not None, "send() before the receiver's metadata"
        n = min(len(src_pages), t.num_pages)
        pairs = list(zip(src_pages[:n], t.dst_pages[:n]))
        cap = self.batch_cap_pages or max(1, n)
        t.unposted = [([s for s, _ in pairs[i : i + cap]], [d for _, d in pairs[i : i + cap]]) for i in range(0, n, cap)]
        t.shipment = shipment
        t.status, t.last_progress_tick = KVPoll.Transferring, self.clock.now
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
                            self.clock.now + self.latency(len(src_pages)), positions)
        self.posted.append(batch)
        t.in_flight += 1
        self.log.add(Event(self.clock.now, "fabric", "post", t.request_id, t.tenant, tuple(dst_pages),
                           f"{len(src_pages)} page(s) posted, lands at tick {batch.due_tick}"))

    def abort(self, room: int, reason: str, status: int = HTTPStatus.INTERNAL_SERVER_ERROR) -> None:
        """Stop the transfer: nothing more is posted. Batches already posted still land."""
        t = self.rooms[room]
        if t.status in (KVPoll.Success, KVPoll.Failed):
            return
        t.unposted = []
        t.status, t.failure, t.failure_status = KVPoll.Failed, reason, status

    def close(self, room: int, side: str) -> None:
        """One endpoint is done with the room; drop it once both are and nothing is in flight."""
        self.rooms[room].open_sides.discard(side)
        self._drop_if_done(room)

    def _drop_if_done(self, room: int) -> None:
        t = self.rooms[room]
        if t.open_sides or t.in_flight:
            return
        del self.rooms[room]
        for audit in (self.src_audit, self.dst_audit):
            if audit is not None:
                audit.retire(t.uid)

    # -- the clock --------------------------------------------------------------------------
    def land_due(self) -> None:
        """End of a tick: land every batch due by now (in posting order), then check timeouts."""
        due = [b for b in self.posted if b.due_tick <= self.clock.now]
        self.posted = [b for b in self.posted if b.due_tick > self.clock.now]
        for b in due:
            self._land(b)
        for t in self.rooms.values():
            if t.status is KVPoll.Transferring and self.clock.now - t.last_progress_tick >= self.timeout_ticks:
                self.abort(t.room, f"KV transfer timed out: no page landed for {self.timeout_ticks} ticks")

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
        self.log.add(Event(self.clock.now, "decode", "write", t.request_id, t.tenant, tuple(b.dst_pages),
                           "KV transfer landed" + (f" LATE, in pages now owned by {sorted(o or 'nobody' for o in owners)}" if late else "")))
        if late:
            self._drop_if_done(t.room)
            return
        t.pages_landed += len(b.dst_pages)
        t.last_progress_tick = self.clock.now
        if t.unposted:
            self._post_next(t)
        elif t.in_flight == 0:
            t.status = KVPoll.Success
        self._drop_if_done(t.room)

    def settled(self, room: int) -> bool:
        """No write of this room is still in the network (what deferred release waits for)."""
        return self.rooms[room].in_flight == 0


