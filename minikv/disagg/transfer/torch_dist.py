"""The KV transfer across a process boundary, on torch.distributed: the second backend (base.py).

`DistKVManager` implements the same `KVTransfer` protocol as the in-process `KVManager`, but each
process holds only its own half: the prefill process the source pool and the sender side, the
decode process the destination pool and the receiver side. Bytes really travel:

    bootstrap  a torch.distributed Store (a TCPStore), keys under `kv/<room>/`: `dst` (the
               receiver's advertised pages), `state` ("sent" or "aborted", decided once with
               compare_set, so that the sender posting and either side aborting never both win),
               `shipment` (num_tokens, first token, checksum, cached tokens, sampler state, batch
               sizes, dtype), `abort` (reason and status), `closed` (the second side to finish
               deletes the room's keys).
    payload    point-to-point `isend`/`irecv` (gloo, which matches by tag) of, per batch, the K/V
               pages (L, 2, n, page, KVH, D) and the writer ledger of their slots (2, n * page):
               the audit's ledger travels with the pages.

The late-write race survives the move, because it is in the protocol, not the simulator: once the
sender has won "sent" its isends are in the network, and the receiver lands them whatever happened
to the request meanwhile; `settled(room)` is False until they have landed, which is what
`deferred_release` waits for. Two knobs of ours: `timeout_s` (a room without progress that long
fails, as the in-process fabric's timeout ticks) and `link_s_per_page` (a slow link that holds each
batch before its isend, so that a cancel can race a late write on purpose). Gloo moves host tensors
only: CUDA pages are staged through host memory (NCCL would match operations by posting order, not
by tag: see dist/worker.WorkerSpec.backend).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from http import HTTPStatus

import torch
import torch.distributed as dist
from torch import Tensor

from minikv.disagg.transfer.base import KVPoll, Shipment, Transfer
from minikv.engine.audit import OwnershipAudit
from minikv.engine.page_pool import PagePool

TAGS_PER_BATCH = 2  # one tag for the pages, one for their writer ledger
MAX_BATCHES_PER_ROOM = 1 << 12  # tags are room * MAX_BATCHES_PER_ROOM * TAGS_PER_BATCH + ...
SENT, ABORTED = "sent", "aborted"
ROOM_KEYS = ("dst", "state", "shipment", "abort", "closed")  # every key a room writes in the store


class TrackedWork:
    """A point-to-point operation and whether it has completed. Gloo's `Work.is_completed()` stays
    False until someone calls `wait()`, so a thread waits on each (as RDMA engines poll their
    completion queues); `result()` re-raises an operation's error."""

    def __init__(self, work: dist.Work) -> None:
        self.work, self._finished, self._error = work, threading.Event(), None
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        try:
            self.work.wait()
        except Exception as error:  # noqa: BLE001 - handed to the caller by result()
            self._error = error
        self._finished.set()

    def done(self) -> bool:
        return self._finished.is_set()

    def result(self) -> None:
        self._finished.wait()
        if self._error is not None:
            raise self._error


def _tag(room: int, batch: int, part: int) -> int:
    assert batch < MAX_BATCHES_PER_ROOM, f"room {room} has more than {MAX_BATCHES_PER_ROOM} batches"
    return (room * MAX_BATCHES_PER_ROOM + batch) * TAGS_PER_BATCH + part


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

    def state(self, room: int) -> str:
        """The room's decided state: "", "sent" or "aborted"."""
        return self.get(room, "state") or ""

    def close(self, room: int) -> None:
        """One side is done; the second to finish clears the room's keys."""
        if self.store.add(f"kv/{room}/closed", 1) == 2:
            for name in ROOM_KEYS:
                self.store.delete_key(f"kv/{room}/{name}")


def _encode_state(state: Tensor | None) -> str | None:
    return None if state is None else base64.b64encode(state.numpy().tobytes()).decode()


def _decode_state(text: str | None) -> Tensor | None:
    return None if text is None else torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


class Wire:
    """This process's point-to-point operations: isends held by the slow link, then posted; irecvs;
    and, per room, the batches whose operations have not all completed yet, in posting order."""

    def __init__(self, peer: int, device: torch.device, link_s_per_page: float) -> None:
        self.peer, self.device, self.link_s_per_page = peer, device, link_s_per_page
        self.posted: dict[int, list[tuple[list[TrackedWork], list[int], Tensor, Tensor]]] = {}  # room -> batches
        self.held: list[tuple[float, int, int, list[int], Tensor, Tensor]] = []  # (post at, room, batch, pages, kv, ledger)

    def hold(self, room: int, batches: list[tuple[list[int], Tensor, Tensor]]) -> None:
        """Queue a room's batches (pages, kv, ledger) on the link: each waits link_s_per_page per page sent before it."""
        now, sent = time.monotonic(), 0
        for i, (pages, kv, ledger) in enumerate(batches):
            sent += len(pages)
            self.held.append((now + self.link_s_per_page * sent, room, i, pages, kv, ledger))

    def post_due(self) -> set[int]:
        """Post the isends of every held batch whose time on the link is over; the rooms that moved."""
        now, still, moved = time.monotonic(), [], set()
        for due, room, i, pages, kv, ledger in self.held:
            if due > now:
                still.append((due, room, i, pages, kv, ledger))
                continue
            works = [TrackedWork(dist.isend(kv, self.peer, tag=_tag(room, i, 0))),
                     TrackedWork(dist.isend(ledger, self.peer, tag=_tag(room, i, 1)))]
            self.posted.setdefault(room, []).append((works, pages, kv, ledger))
            moved.add(room)
        self.held = still
        return moved

    def receive(self, room: int, batches: list[list[int]], shape: tuple[int, ...], dtype: torch.dtype) -> None:
        """Post the irecvs of a room's batches (destination pages each), into fresh buffers."""
        L, two, _, ps, kvh, d = shape
        for i, pages in enumerate(batches):
            kv = torch.empty((L, two, len(pages), ps, kvh, d), dtype=dtype, device=self.device)  # (L, 2, n, page, KVH, D)
            ledger = torch.empty((2, len(pages) * ps), dtype=torch.long, device=self.device)  # (2, n * page)
            works = [TrackedWork(dist.irecv(kv, self.peer, tag=_tag(room, i, 0))),
                     TrackedWork(dist.irecv(ledger, self.peer, tag=_tag(room, i, 1)))]
            self.posted.setdefault(room, []).append((works, pages, kv, ledger))

    def completed(self, room: int) -> list[tuple[list[int], Tensor, Tensor, Exception | None]]:
        """The room's batches whose operations have all completed, oldest first: (pages, kv, ledger, error)."""
        pending, done = self.posted.get(room, []), []
        while pending and all(w.done() for w in pending[0][0]):
            works, pages, kv, ledger = pending.pop(0)
            try:
                for w in works:
                    w.result()
                done.append((pages, kv, ledger, None))
            except Exception as error:  # noqa: BLE001 - the peer is gone or the link broke: this batch never lands
                done.append((pages, kv, ledger, error))
        if not pending:
            self.posted.pop(room, None)
        return done

    def busy(self, room: int) -> bool:
        """Some operation of `room` is held or posted and not completed."""
        return bool(self.posted.get(room)) or any(r == room for _, r, *_ in self.held)


class DistKVManager:
    """This process's half of the transfer: its pool, its side of each room, and its wire.

    `side` is "sender" (prefill: `pool` is the source) or "receiver" (decode: `pool` is the
    destination); `peer` is the other process's rank in the default process group.
    """

    def __init__(self, side: str, pool: PagePool, audit: OwnershipAudit | None, store: dist.Store, peer: int,
                 batch_cap_pages: int | None = None, timeout_s: float | None = None,
                 link_s_per_page: float = 0.0) -> None:
        assert side in ("sender", "receiver"), f"unknown side {side!r}"
        self.side, self.pool, self.audit = side, pool, audit
        self.bootstrap = Bootstrap(store)
        self.batch_cap_pages, self.timeout_s = batch_cap_pages, timeout_s
        gloo = dist.is_initialized() and dist.get_backend() == "gloo"
        self.wire = Wire(peer, torch.device("cpu") if gloo else pool.kv.device, link_s_per_page)  # gloo: host tensors only
        self.rooms: dict[int, Transfer] = {}
        self.last_progress_s: dict[int, float] = {}  # room -> when its operations last made progress
        # (room, dst pages, owners of those pages when it landed) of writes that landed after an abort
        self.landed_late: list[tuple[int, list[int], list[str]]] = []

    def open_room(self, room: int, request_id: str, tenant: str, uid: int) -> Transfer:
        assert room not in self.rooms, f"room {room} opened twice"
        t = Transfer(room, request_id, tenant, uid)
        t.open_sides = {self.side}  # the other side lives in the other process
        self.rooms[room] = t
        return t

    def poll(self, room: int) -> KVPoll:
        """The room's state as this side sees it, after reading the bootstrap store."""
        t = self.rooms[room]
        if t.status in (KVPoll.Bootstrapping, KVPoll.Transferring) and self._peer_aborted(t):
            t.unposted = []
        if self.side == "sender" and t.status is KVPoll.Bootstrapping and t.dst_pages is None:
            t.dst_pages = self.bootstrap.get(room, "dst")
        if t.status is KVPoll.Bootstrapping and t.dst_pages is not None:
            return KVPoll.WaitingForInput
        self._check_timeout(t)
        return t.status

    def _check_timeout(self, t: Transfer) -> None:
        """A Transferring room whose operations made no progress for timeout_s is aborted here."""
        if self.timeout_s is None or t.status is not KVPoll.Transferring:
            return
        if time.monotonic() - self.last_progress_s.get(t.room, time.monotonic()) > self.timeout_s:
            self.abort(t.room, f"KV transfer timed out: no progress for {self.timeout_s:g} s")

    def _peer_aborted(self, t: Transfer) -> bool:
        """Read an abort the other side decided; mark the room Failed here too."""
        info = self.bootstrap.get(t.room, "abort")
        if info is None:
            return False
        if t.status is not KVPoll.Failed:
            t.status, t.failure, t.failure_status = KVPoll.Failed, info["reason"], info["status"]
        return True

    def settled(self, room: int, advance: bool = True) -> bool:
        """No write of this room is in the network: nothing announced is left to land here
        (after advancing every operation, unless `advance` is False)."""
        if advance:
            self.land_due()
        if room not in self.rooms:
            return True
        if self.side == "receiver" and self.bootstrap.state(room) == SENT and self.rooms[room].shipment is None:
            return False  # sent, not yet received here: the write is on its way
        return not self.wire.busy(room)

    # -- the receiver's side (decode) ---------------------------------------------------------
    def send_metadata(self, room: int, dst_pages: list[int]) -> None:
        assert self.side == "receiver"
        self.rooms[room].dst_pages = list(dst_pages)
        self.bootstrap.set(room, "dst", list(dst_pages))

    # -- the sender's side (prefill) ----------------------------------------------------------
    def init_sender(self, room: int, num_pages: int) -> None:
        assert self.side == "sender"
        self.rooms[room].num_pages = num_pages

    def send(self, room: int, src_pages: list[int], shipment: Shipment) -> None:
        """Post the room's pages: claim `state = sent` (unless an abort won), announce, isend."""
        assert self.side == "sender"
        t = self.rooms[room]
        assert t.dst_pages is not None and t.num_pages is not None, "send() before the receiver's metadata"
        t.shipment = shipment
        if not self.bootstrap.claim(room, SENT):  # the receiver aborted first: nothing is posted
            self._peer_aborted(t)
            return
        n, ps = min(len(src_pages), t.num_pages), self.pool.page_size
        cap = self.batch_cap_pages or max(1, n)
        batches = []
        for pages in (src_pages[i : i + cap] for i in range(0, n, cap)):
            slots = torch.tensor([p * ps + o for p in pages for o in range(ps)], device=self.pool.kv.device)
            ledger = (torch.stack([self.audit.writers[slots], self.audit.positions[slots]]) if self.audit is not None
                      else torch.full((2, slots.numel()), -1, dtype=torch.long))  # (2, n * page) writer uid, position
            batches.append((pages, self.pool.kv[:, :, pages].to(self.wire.device), ledger.to(self.wire.device)))
        self.bootstrap.set(room, "shipment", {
            "num_tokens": shipment.num_tokens, "first_token": shipment.first_token, "checksum": shipment.checksum,
            "cached_tokens": shipment.cached_tokens, "sampler_state": _encode_state(shipment.sampler_state),
            "batches": [len(b[0]) for b in batches], "dtype": str(self.pool.kv.dtype), "uid": t.uid})
        self.wire.hold(room, batches)  # kv: (L, 2, n, page, KVH, D), a snapshot of the source (indexing copies)
        t.in_flight, t.status = len(batches), KVPoll.Transferring
        self.last_progress_s[room] = time.monotonic()
        self.wire.post_due()

    # -- either side --------------------------------------------------------------------------
    def abort(self, room: int, reason: str, status: int = HTTPStatus.INTERNAL_SERVER_ERROR) -> None:
        """Stop the transfer: if nothing was sent yet, nothing will be. What was sent still lands."""
        t = self.rooms[room]
        if t.status in (KVPoll.Success, KVPoll.Failed):
            return
        self.bootstrap.claim(room, ABORTED)  # loses to "sent" if the sender posted first
        self.bootstrap.set(room, "abort", {"reason": reason, "status": int(status)})
        t.unposted = []
        t.status, t.failure, t.failure_status = KVPoll.Failed, reason, int(status)

    def close(self, room: int, side: str) -> None:
        """This side is done with the room; drop it once nothing of it is in flight here."""
        self.rooms[room].open_sides.discard(side)
        self._drop_if_done(room)

    def _drop_if_done(self, room: int) -> None:
        t = self.rooms[room]
        if t.open_sides or not self.settled(room, advance=False):
            return
        del self.rooms[room]
        self.last_progress_s.pop(room, None)
        if self.audit is not None:
            self.audit.retire(t.uid)
        self.bootstrap.close(room)

    # -- progress -----------------------------------------------------------------------------
    def land_due(self) -> None:
        """Advance every room: the receiver posts irecvs for announced shipments, held isends go out
        when due, completed operations land (receiver) or finish (sender), stalled rooms time out."""
        now = time.monotonic()
        for t in list(self.rooms.values()):
            if self.side == "receiver" and t.shipment is None and t.dst_pages is not None:
                self._receive(t)
        for room in self.wire.post_due():
            self.last_progress_s[room] = now
        for t in list(self.rooms.values()):
            done = self.wire.completed(t.room)
            for pages, kv, ledger, error in done:
                t.in_flight -= 1
                self.last_progress_s[t.room] = now
                if error is not None:
                    self.abort(t.room, f"KV transfer failed: {type(error).__name__}: {error}")
                    continue
                if self.side == "receiver":
                    self._land(t, pages, kv, ledger)
                if t.status is not KVPoll.Failed:
                    t.pages_landed += len(pages)
            if done and not self.wire.busy(t.room):
                if t.status is KVPoll.Transferring:
                    t.status = KVPoll.Success
                if not t.open_sides:
                    self._drop_if_done(t.room)
        for t in list(self.rooms.values()):
            self._check_timeout(t)

    def _receive(self, t: Transfer) -> None:
        """Once the sender has announced its shipment (it does so only after winning "sent"): post the
        irecvs, batch by batch, into the advertised pages."""
        meta = self.bootstrap.get(t.room, "shipment")
        if meta is None:
            return
        t.shipment = Shipment(meta["num_tokens"], meta["first_token"], meta["checksum"],
                              _decode_state(meta["sampler_state"]), meta["cached_tokens"])
        assert meta["dtype"] == str(self.pool.kv.dtype), f"prefill sends {meta['dtype']}, this pool holds {self.pool.kv.dtype}"
        starts = [sum(meta["batches"][:i]) for i in range(len(meta["batches"]))]
        self.wire.receive(t.room, [t.dst_pages[s : s + n] for s, n in zip(starts, meta["batches"])],
                          tuple(self.pool.kv.shape), self.pool.kv.dtype)
        t.in_flight = len(meta["batches"])
        self.last_progress_s[t.room] = time.monotonic()
        if t.status is not KVPoll.Failed:
            t.status = KVPoll.Transferring

    def _land(self, t: Transfer, pages: list[int], kv: Tensor, ledger: Tensor) -> None:
        """The write lands in the advertised pages, whoever owns them now."""
        dst = torch.tensor(pages, device=self.pool.kv.device)
        self.pool.kv[:, :, dst] = kv.to(self.pool.kv.device)
        if t.status is KVPoll.Failed:
            self.landed_late.append((t.room, list(pages), sorted({h for p in pages for h in self.pool.holders[p]})))
        if self.audit is not None:
            ps = self.pool.page_size
            slots = (dst[:, None] * ps + torch.arange(ps, device=dst.device)).flatten()  # (n * page,)
            ledger = ledger.to(dst.device)
            self.audit.record_writes(slots, ledger[0], ledger[1])
