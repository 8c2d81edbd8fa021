"""The in-process backend (base.py): `KVManager` is the bootstrap server and the fabric at once,
holding both pools; a posted batch lands `base_latency + pages` ticks of the cluster's clock later.
"""

from dataclasses import dataclass

from torch import Tensor

from minikv.disagg.transfer.base import KVPoll, KVTransfer, Shipment, Transfer, read_pages, write_pages
from minikv.engine.audit import OwnershipAudit
from minikv.engine.events import Clock, Event, EventLog
from minikv.engine.page_pool import PagePool


@dataclass
class PostedBatch:
    """Pages in flight: a snapshot of the source K/V and ledger, landing at `due_tick`."""
    room: int
    dst_pages: list[int]
    kv: Tensor  # (L, 2, n, page, KVH, D) read from the prefill pool when posted
    ledger: Tensor  # (2, n * page) writer uid and token position of every source slot
    due_tick: int


class KVManager(KVTransfer):
    """The bootstrap server and the fabric: both pools, the rooms, the posted batches, on the pair's clock."""

    def __init__(self, src: PagePool, dst: PagePool, src_audit: OwnershipAudit | None,
                 dst_audit: OwnershipAudit | None, log: EventLog, clock: Clock, base_latency: int = 1,
                 pages_per_tick: int = 1, timeout_ticks: int = 16,
                 batch_cap_pages: int | None = None) -> None:
        super().__init__(("sender", "receiver"), (src_audit, dst_audit), batch_cap_pages)
        self.src, self.dst, self.log = src, dst, log
        self.src_audit, self.dst_audit = src_audit, dst_audit
        self.clock, self.timeout_ticks = clock, timeout_ticks
        self.base_latency, self.pages_per_tick = base_latency, pages_per_tick
        self.posted: list[PostedBatch] = []

    def send(self, room: int, src_pages: list[int], shipment: Shipment) -> None:
        t = self.rooms[room]
        t.unposted = self.batches(t, src_pages)
        t.shipment = shipment
        t.status, t.last_progress = KVPoll.Transferring, self.clock.now
        self._post_next(t)

    def _post_next(self, t: Transfer) -> None:
        """Post the next batch of `t`: one batch in flight per room, as a DMA queue."""
        if not t.unposted:
            return
        src_pages, dst_pages = t.unposted.pop(0)
        kv, ledger = read_pages(self.src, self.src_audit, src_pages)
        ticks = self.base_latency + -(-len(src_pages) // self.pages_per_tick)  # its time on the wire
        batch = PostedBatch(t.room, dst_pages, kv, ledger, self.clock.now + ticks)
        self.posted.append(batch)
        t.in_flight += 1
        self.log.add(Event(self.clock.now, "fabric", "post", t.request_id, t.tenant, tuple(dst_pages),
                           f"{len(src_pages)} page(s) posted, lands at tick {batch.due_tick}"))

    def land_due(self) -> None:
        """End of a tick: land every batch due by now (in posting order), then check timeouts."""
        due = [b for b in self.posted if b.due_tick <= self.clock.now]
        self.posted = [b for b in self.posted if b.due_tick > self.clock.now]
        for b in due:
            self._land(b)
        for t in self.rooms.values():
            if t.status is KVPoll.Transferring and self.clock.now - t.last_progress >= self.timeout_ticks:
                self.abort(t.room, f"KV transfer timed out: no page landed for {self.timeout_ticks} ticks")

    def _land(self, b: PostedBatch) -> None:
        t = self.rooms[b.room]
        write_pages(self.dst, self.dst_audit, b.dst_pages, b.kv, b.ledger)  # whoever owns the pages now
        t.in_flight -= 1
        late = t.status is KVPoll.Failed
        owners = sorted({(self.dst.holders[p] or ["nobody"])[0] for p in b.dst_pages})  # first holder of each
        self.log.add(Event(self.clock.now, "decode", "write", t.request_id, t.tenant, tuple(b.dst_pages),
                           "KV transfer landed" + (f" LATE, in pages now owned by {owners}" if late else "")))
        if not late:
            t.last_progress = self.clock.now
            if t.unposted:
                self._post_next(t)
            elif t.in_flight == 0:
                t.status = KVPoll.Success
        self._drop_if_done(t.room)
