"""The KV transfer across a process boundary, on torch.distributed: each process holds its half.
A room's bootstrap goes through a TCPStore (`Bootstrap`), its pages and writer ledger by
`isend`/`irecv` over gloo, which matches by tag (the store's keys: docs/disagg.md).
"""

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import torch
import torch.distributed as dist
from torch import Tensor

from minikv.disagg.transfer.base import KVPoll, KVTransfer, Shipment, Transfer, read_pages, write_pages
from minikv.engine.audit import OwnershipAudit
from minikv.engine.page_pool import PagePool

TAGS_PER_BATCH = 2  # one tag for the pages, one for their writer ledger
MAX_BATCHES_PER_ROOM = 1 << 12  # tags are room * MAX_BATCHES_PER_ROOM * TAGS_PER_BATCH + ...
SENT, ABORTED = "sent", "aborted"
ROOM_KEYS = ("dst", "state", "shipment", "abort", "closed")  # every key a room writes in the store


class Bootstrap:
    """The rooms' keys in the shared store (`kv/<room>/<name>`): what both processes read and write."""

    def __init__(self, store: dist.Store) -> None:
        self.store = store

    def get(self, room: int, name: str) -> object | None:
        """The JSON value of a room's key, or None while it is not set."""
        key = f"kv/{room}/{name}"
        return json.loads(self.store.get(key)) if self.store.check([key]) else None

    def set(self, room: int, name: str, value: object) -> None:
        self.store.set(f"kv/{room}/{name}", json.dumps(value))

    def claim(self, room: int, state: str) -> bool:
        """Decide the room's state once: "sent" (the sender posted) or "aborted"; True if `state` won."""
        return json.loads(self.store.compare_set(f"kv/{room}/state", "", json.dumps(state))) == state

    def close(self, room: int) -> None:
        """One side is done; the second to finish clears the room's keys."""
        if self.store.add(f"kv/{room}/closed", 1) == 2:
            for name in ROOM_KEYS:
                self.store.delete_key(f"kv/{room}/{name}")


@dataclass
class WireBatch:
    """One batch on the wire: its pages here, its K/V (L, 2, n, page, KVH, D) and ledger (2, n * page)."""
    room: int
    index: int  # its place in the room's batches, which its tags are made of
    pages: list[int]
    kv: Tensor
    ledger: Tensor
    post_at: float = 0.0  # the sender's slow link holds it until then
    done: threading.Event = field(default_factory=threading.Event)  # set once its operations completed
    error: BaseException | None = None  # why they failed (the peer is gone, the link broke)

    def wait(self, works: list[dist.Work]) -> None:
        """Wait for its operations, on a thread of their own: gloo's `Work.is_completed()` stays False
        until someone calls `wait()` (as RDMA engines poll their completion queues)."""
        try:
            for work in works:
                work.wait()
        except Exception as error:  # noqa: BLE001 - handed to the manager, which fails the room
            self.error = error
        self.done.set()


class Wire:
    """This process's point-to-point operations: isends held by the slow link, then posted; irecvs;
    and, per room, the batches whose operations have not all completed yet, in posting order."""

    def __init__(self, peer: int, device: torch.device, link_s_per_page: float) -> None:
        self.peer, self.device, self.link_s_per_page = peer, device, link_s_per_page
        self.posted: dict[int, list[WireBatch]] = {}  # room -> its batches posted and not completed
        self.held: list[WireBatch] = []

    def hold(self, batches: list[WireBatch]) -> None:
        """Queue a room's batches on the link: each waits link_s_per_page per page sent before it."""
        now, sent = time.monotonic(), 0
        for batch in batches:
            sent += len(batch.pages)
            batch.post_at = now + self.link_s_per_page * sent
        self.held += batches

    def post_due(self) -> set[int]:
        """Post the isends of every held batch whose time on the link is over; the rooms that moved."""
        now = time.monotonic()
        due, self.held = [b for b in self.held if b.post_at <= now], [b for b in self.held if b.post_at > now]
        for batch in due:
            self.post(batch, dist.isend)
        return {batch.room for batch in due}

    def post(self, batch: WireBatch, operation: Callable[..., dist.Work]) -> None:
        """Post a batch's pages and ledger with `operation` (dist.isend or dist.irecv), each under its tag."""
        assert batch.index < MAX_BATCHES_PER_ROOM, f"room {batch.room}: too many batches for its tags"
        first_tag = (batch.room * MAX_BATCHES_PER_ROOM + batch.index) * TAGS_PER_BATCH
        works = [operation(x, self.peer, tag=first_tag + i) for i, x in enumerate((batch.kv, batch.ledger))]
        threading.Thread(target=batch.wait, args=(works,), daemon=True).start()
        self.posted.setdefault(batch.room, []).append(batch)

    def completed(self, room: int) -> list[WireBatch]:
        """The room's batches whose operations have all completed, oldest first."""
        pending, done = self.posted.get(room, []), []
        while pending and pending[0].done.is_set():
            done.append(pending.pop(0))
        if not pending:
            self.posted.pop(room, None)
        return done


class DistKVManager(KVTransfer):
    """This process's half of the transfer: its pool, its side of each room, and its wire. `side` is
    "sender" (prefill: `pool` is the source) or "receiver" (decode); `peer` is the other rank."""

    def __init__(self, side: str, pool: PagePool, audit: OwnershipAudit | None, store: dist.Store, peer: int,
                 batch_cap_pages: int | None = None, timeout_s: float | None = None,
                 link_s_per_page: float = 0.0) -> None:
        assert side in ("sender", "receiver"), f"unknown side {side!r}"
        super().__init__((side,), (audit,), batch_cap_pages)  # the other side lives in the other process
        self.side, self.pool, self.audit, self.timeout_s = side, pool, audit, timeout_s
        self.bootstrap = Bootstrap(store)
        gloo = dist.is_initialized() and dist.get_backend() == "gloo"
        self.wire = Wire(peer, torch.device("cpu") if gloo else pool.kv.device, link_s_per_page)  # gloo: host
        self.landed_late: list[dict] = []  # writes landed after an abort: room, pages, their holders then

    def _refresh(self, t: Transfer) -> None:
        """Read the bootstrap store: an abort the other side decided, and (sender) the advertised pages."""
        live = t.status in (KVPoll.Bootstrapping, KVPoll.Transferring)
        if live and (info := self.bootstrap.get(t.room, "abort")):
            t.fail(info["reason"], info["status"])
        if self.side == "sender" and t.status is KVPoll.Bootstrapping and t.dst_pages is None:
            t.dst_pages = self.bootstrap.get(t.room, "dst")
        self._check_timeout(t)

    def _check_timeout(self, t: Transfer) -> None:
        """A Transferring room whose operations made no progress for timeout_s is aborted here."""
        if self.timeout_s is None or t.status is not KVPoll.Transferring:
            return
        if time.monotonic() - t.last_progress > self.timeout_s:
            self.abort(t.room, f"KV transfer timed out: no progress for {self.timeout_s:g} s")

    def settled(self, room: int, advance: bool = True) -> bool:
        """No write of this room is in the network: nothing announced is left to land here
        (after advancing every operation, unless `advance` is False)."""
        if advance:
            self.land_due()
        t = self.rooms.get(room)
        if t is None:
            return True
        if self.side == "receiver" and t.shipment is None and self.bootstrap.get(room, "state") == SENT:
            return False  # sent, not yet received here: the write is on its way
        return t.in_flight == 0

    def send_metadata(self, room: int, dst_pages: list[int]) -> None:
        assert self.side == "receiver"
        super().send_metadata(room, dst_pages)
        self.bootstrap.set(room, "dst", list(dst_pages))

    def send(self, room: int, src_pages: list[int], shipment: Shipment) -> None:
        """Post the room's pages: claim `state = sent` (unless an abort won), announce, isend."""
        assert self.side == "sender"
        t = self.rooms[room]
        batches = self.batches(t, src_pages)
        t.shipment = shipment
        if not self.bootstrap.claim(room, SENT):  # the receiver aborted first: nothing is posted
            self._refresh(t)  # and its abort fails the room here
            return
        state = None if shipment.sampler_state is None else shipment.sampler_state.tolist()  # JSON: bytes
        sizes = [len(src) for src, _ in batches]
        self.bootstrap.set(room, "shipment", {**vars(shipment), "sampler_state": state, "batches": sizes,
                                              "dtype": str(self.pool.kv.dtype)})
        on_wire = []
        for i, (src, _) in enumerate(batches):
            kv, ledger = read_pages(self.pool, self.audit, src)  # a snapshot of the source
            on_wire.append(WireBatch(room, i, src, kv.to(self.wire.device), ledger.to(self.wire.device)))
        self.wire.hold(on_wire)
        t.in_flight = len(on_wire)
        t.status = KVPoll.Transferring
        t.last_progress = time.monotonic()
        self.wire.post_due()

    def abort(self, room: int, reason: str, status: int = HTTPStatus.INTERNAL_SERVER_ERROR) -> None:
        """Stop the transfer and tell the other side: if nothing was sent yet, nothing will be."""
        t = self.rooms[room]
        if t.status not in (KVPoll.Success, KVPoll.Failed):
            self.bootstrap.claim(room, ABORTED)  # loses to "sent" if the sender posted first
            self.bootstrap.set(room, "abort", {"reason": reason, "status": int(status)})
        t.fail(reason, status)

    def _drop_if_done(self, room: int) -> None:
        if self.settled(room, advance=False):  # nor a write sent and not yet received here
            super()._drop_if_done(room)
            if room not in self.rooms:
                self.bootstrap.close(room)

    def land_due(self) -> None:
        """Advance every room: held isends go out when due, the receiver posts irecvs for announced shipments,
        completed operations land (receiver) or finish (sender), stalled rooms time out."""
        now = time.monotonic()
        for room in self.wire.post_due():
            self.rooms[room].last_progress = now
        for t in list(self.rooms.values()):
            if self.side == "receiver" and t.shipment is None and t.dst_pages is not None:
                self._receive(t)
            done = self.wire.completed(t.room)
            for batch in done:
                t.in_flight -= 1
                t.last_progress = now
                if batch.error is not None:
                    self.abort(t.room, f"KV transfer failed: {type(batch.error).__name__}: {batch.error}")
                    continue
                if self.side == "receiver":
                    self._land(t, batch)
            if done and t.in_flight == 0:
                if t.status is KVPoll.Transferring:
                    t.status = KVPoll.Success
                self._drop_if_done(t.room)
            self._check_timeout(t)  # a dropped room has ended: never Transferring

    def _receive(self, t: Transfer) -> None:
        """Once the sender has announced its shipment (it does so only after winning "sent"): post the
        irecvs, batch by batch, into fresh buffers for the advertised pages."""
        meta = self.bootstrap.get(t.room, "shipment")
        if meta is None:
            return
        sizes, sent_dtype, state = meta.pop("batches"), meta.pop("dtype"), meta.pop("sampler_state")
        dtype = self.pool.kv.dtype
        assert sent_dtype == str(dtype), f"prefill sends {sent_dtype}, this pool holds {dtype}"
        state = None if state is None else torch.tensor(state, dtype=torch.uint8)
        t.shipment = Shipment(**meta, sampler_state=state)
        shape, start = self.pool.kv.shape, 0  # (L, 2, P, page, KVH, D)
        for i, n in enumerate(sizes):
            kv = torch.empty((*shape[:2], n, *shape[3:]), dtype=dtype, device=self.wire.device)
            ledger = torch.empty((2, n * self.pool.page_size), dtype=torch.long, device=self.wire.device)
            self.wire.post(WireBatch(t.room, i, t.dst_pages[start : start + n], kv, ledger), dist.irecv)
            start += n
        t.in_flight, t.last_progress = len(sizes), time.monotonic()
        if t.status is not KVPoll.Failed:
            t.status = KVPoll.Transferring

    def _land(self, t: Transfer, batch: WireBatch) -> None:
        """The write lands in the advertised pages, whoever owns them now."""
        if t.status is KVPoll.Failed:
            holders = sorted({h for p in batch.pages for h in self.pool.holders[p]})
            self.landed_late.append({"room": t.room, "pages": batch.pages, "holders": holders})
        write_pages(self.pool, self.audit, batch.pages, batch.kv, batch.ledger)
