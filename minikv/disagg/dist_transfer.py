"""The KV transfer across a process boundary, on torch.distributed: the second backend.

`transfer.KVManager` is the in-process fabric (the notebooks' default): one object holds both
pools and lands posted batches on the cluster's clock. `DistKVManager` offers the same calls
(`open_room`, `poll`, `send_metadata`, `init_sender`, `send`, `abort`, `close`, `settled`,
`land_due`, `rooms`), so `KVSender`, `KVReceiver` and `KVPoll` keep their meaning, but each
process holds only its own half: the prefill process the source pool and the sender side, the
decode process the destination pool and the receiver side. Bytes really travel:

    bootstrap  a torch.distributed Store (a TCPStore in practice), keys under `kv/<room>/`:
               `dst`       the receiver's advertised destination pages (JSON list)
               `state`     "" -> "sent" or "aborted", decided once with compare_set, so that
                           the sender posting and either side aborting can never both win
               `shipment`  num_tokens, first_token, checksum, cached_tokens, sampler state,
                           page count, batch sizes, dtype (JSON)
               `abort`     the reason and status of an abort (JSON)
               `closed`    how many sides have dropped the room; the second deletes its keys
    payload    point-to-point `isend`/`irecv` (gloo, which matches by tag; NCCL is not used:
               its point-to-point ops ignore tags and match in posting order) of, per batch, the
               K/V pages `(L, 2, n, page, KVH, D)` and the writer ledger of their slots
               `(2, n * page)` (writer uid, token position): the audit's ledger travels with
               the pages.

Polling reflects the real state of the operations (see `Completion`): a room is `Transferring` while a posted
operation has not completed, and `land_due()` lands a batch (scatters the received pages into the
pool at the advertised pages and records their writers) only once its irecv has completed.

The late-write race survives the move, because it is in the protocol, not the simulator: once
the sender has won `state = "sent"` its isends are in the network, and the receiver must post
the matching irecvs and land them whatever happened to the request meanwhile. An abort only
stops what was not yet sent. `settled(room)` is False until every announced batch has landed,
which is what `deferred_release` waits for; without it the pages can be reused before the late
write lands in them.

Two knobs of ours, neither in SGLang:
    timeout_s         a room whose posted operations make no progress for this long is aborted
                      (Failed, 500), as the in-process fabric's `transfer_timeout_ticks`; what was
                      posted may still land later, so the room is not settled until it does.
    link_s_per_page   a slow link, for the lessons: the sender holds each batch for this many
                      seconds per page (a room's batches one after another, as a link of fixed
                      bandwidth) before its isend is posted. The room is Transferring, and the
                      receiver has posted its irecvs, all that while: a cancel then races a real
                      late write, with a window wide enough to hit on purpose.

Gloo moves CPU tensors only: between CUDA pools the pages are staged through host memory (the
workers use gloo on GPUs too, see dist_worker.WorkerSpec.backend; with NCCL they would go device to
device, once both sides post rooms in one agreed order). `dist_nodes.py` runs the prefill and
decode nodes on it in two processes; `dist_cluster.py` puts the front door in front of them.
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

from minikv.audit import OwnershipAudit
from minikv.disagg.transfer import KVPoll, Shipment, Transfer
from minikv.page_pool import PagePool

TAGS_PER_BATCH = 2  # one tag for the pages, one for their writer ledger
MAX_BATCHES_PER_ROOM = 1 << 12  # tags are room * MAX_BATCHES_PER_ROOM * TAGS_PER_BATCH + ...
SENT, ABORTED = "sent", "aborted"
ROOM_KEYS = ("dst", "state", "shipment", "abort", "closed")  # every key a room writes in the store


class Completion:
    """A point-to-point operation and whether it has completed, as it really stands.

    Gloo's send/recv `Work.is_completed()` stays False until someone calls `wait()`, even after
    the bytes have moved, so a helper thread waits on each operation (a progress thread, as RDMA
    engines poll their completion queues) and `done()` reads what it saw. An operation that
    failed re-raises its error from `result()`.
    """

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


def _key(room: int, name: str) -> str:
    return f"kv/{room}/{name}"


def _tag(room: int, batch: int, part: int) -> int:
    assert batch < MAX_BATCHES_PER_ROOM, f"room {room} has more than {MAX_BATCHES_PER_ROOM} batches"
    return (room * MAX_BATCHES_PER_ROOM + batch) * TAGS_PER_BATCH + part


def _encode_state(state: Tensor | None) -> str | None:
    return None if state is None else base64.b64encode(state.numpy().tobytes()).decode()


def _decode_state(text: str | None) -> Tensor | None:
    return None if text is None else torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


class DistKVManager:
    """This process's half of the transfer: its pool, its side of each room, and its Work handles.

    `side` is "sender" (prefill: `pool` is the source) or "receiver" (decode: `pool` is the
    destination); `peer` is the other process's rank in the default process group.
    """

    def __init__(self, side: str, pool: PagePool, audit: OwnershipAudit | None, store: dist.Store, peer: int,
                 batch_cap_pages: int | None = None, timeout_s: float | None = None,
                 link_s_per_page: float = 0.0) -> None:
        assert side in ("sender", "receiver"), f"unknown side {side!r}"
        self.side, self.pool, self.audit, self.store, self.peer = side, pool, audit, store, peer
        self.batch_cap_pages, self.timeout_s, self.link_s_per_page = batch_cap_pages, timeout_s, link_s_per_page
        self.rooms: dict[int, Transfer] = {}
        # room -> posted operations not yet completed: (work handles, dst pages, kv buffer, ledger buffer)
        self.posted: dict[int, list[tuple[list[Completion], list[int], Tensor, Tensor]]] = {}
        # the sender's batches held by the slow link: (when to post, room, batch index, pages, kv, ledger)
        self.held: list[tuple[float, int, int, list[int], Tensor, Tensor]] = []
        self.last_progress_s: dict[int, float] = {}  # room -> when its operations last made progress
        # (room, dst pages, owners of those pages when it landed) of writes that landed after an abort
        self.landed_late: list[tuple[int, list[int], list[str]]] = []
        gloo = dist.is_initialized() and dist.get_backend() == "gloo"
        self.wire = torch.device("cpu") if gloo else pool.kv.device  # gloo moves host tensors only

    def open_room(self, room: int, request_id: str, tenant: str, uid: int) -> Transfer:
        assert room not in self.rooms, f"room {room} opened twice"
        t = Transfer(room, request_id, tenant, uid)
        t.open_sides = {self.side}  # the other side lives in the other process
        self.rooms[room] = t
        return t

    # -- polling ------------------------------------------------------------------------------
    def poll(self, room: int) -> KVPoll:
        """The room's state as this side sees it, after reading the bootstrap store."""
        t = self.rooms[room]
        if t.status in (KVPoll.Bootstrapping, KVPoll.Transferring) and self._peer_aborted(t):
            t.unposted = []
        if self.side == "sender" and t.status is KVPoll.Bootstrapping and t.dst_pages is None \
                and self.store.check([_key(room, "dst")]):
            t.dst_pages = json.loads(self.store.get(_key(room, "dst")))
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
        if not self.store.check([_key(t.room, "abort")]):
            return False
        info = json.loads(self.store.get(_key(t.room, "abort")))
        if t.status is not KVPoll.Failed:
            t.status, t.failure, t.failure_status = KVPoll.Failed, info["reason"], info["status"]
        return True

    def settled(self, room: int) -> bool:
        """No write of this room is in the network: nothing announced is left to land here."""
        self.land_due()
        return room not in self.rooms or self.settled_locally(room)

    def settled_locally(self, room: int) -> bool:
        """As `settled`, without advancing any operation first."""
        t = self.rooms[room]
        if self.side == "receiver" and self.room_state(room) == SENT and t.shipment is None:
            return False  # sent, not yet received here: the write is on its way
        return not self.posted.get(room) and not any(r == room for _, r, *_ in self.held)

    def room_state(self, room: int) -> str:
        """The room's decided state in the store: "", "sent" or "aborted"."""
        key = _key(room, "state")
        return self.store.get(key).decode() if self.store.check([key]) else ""

    # -- the receiver's side (decode) ---------------------------------------------------------
    def send_metadata(self, room: int, dst_pages: list[int]) -> None:
        assert self.side == "receiver"
        t = self.rooms[room]
        t.dst_pages = list(dst_pages)
        self.store.set(_key(room, "dst"), json.dumps(t.dst_pages))

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
        won = self.store.compare_set(_key(room, "state"), "", SENT).decode() == SENT
        if not won:  # the receiver aborted first: nothing is posted
            self._peer_aborted(t)
            return
        n = min(len(src_pages), t.num_pages)
        cap = self.batch_cap_pages or max(1, n)
        batches = [src_pages[i : i + cap] for i in range(0, n, cap)]
        meta = {"num_tokens": shipment.num_tokens, "first_token": shipment.first_token,
                "checksum": shipment.checksum, "cached_tokens": shipment.cached_tokens,
                "sampler_state": _encode_state(shipment.sampler_state), "batches": [len(b) for b in batches],
                "dtype": str(self.pool.kv.dtype), "uid": t.uid}
        self.store.set(_key(room, "shipment"), json.dumps(meta))
        ps, now, sent_pages = self.pool.page_size, time.monotonic(), 0
        for i, pages in enumerate(batches):
            kv = self.pool.kv[:, :, pages].to(self.wire)  # (L, 2, n, page, KVH, D) a snapshot of the source (indexing copies)
            slots = torch.tensor([p * ps + o for p in pages for o in range(ps)], device=self.pool.kv.device)
            ledger = self._ledger(slots).to(self.wire)  # (2, n * page) writer uid, token position
            sent_pages += len(pages)
            self.held.append((now + self.link_s_per_page * sent_pages, room, i, pages, kv, ledger))
        t.in_flight = len(batches)
        t.status = KVPoll.Transferring
        self.last_progress_s[room] = now
        self._post_held()

    def _post_held(self) -> None:
        """Post the isends of every held batch whose time on the slow link is over."""
        now, still = time.monotonic(), []
        for due, room, i, pages, kv, ledger in self.held:
            if due > now:
                still.append((due, room, i, pages, kv, ledger))
                continue
            works = [Completion(dist.isend(kv, self.peer, tag=_tag(room, i, 0))),
                     Completion(dist.isend(ledger, self.peer, tag=_tag(room, i, 1)))]
            self.posted.setdefault(room, []).append((works, pages, kv, ledger))
            self.last_progress_s[room] = now
        self.held = still

    def _ledger(self, slots: Tensor) -> Tensor:
        if self.audit is None:
            return torch.full((2, slots.numel()), -1, dtype=torch.long)
        return torch.stack([self.audit.writers[slots], self.audit.positions[slots]]).cpu()  # (2, n * page)

    # -- either side --------------------------------------------------------------------------
    def abort(self, room: int, reason: str, status: int = HTTPStatus.INTERNAL_SERVER_ERROR) -> None:
        """Stop the transfer: if nothing was sent yet, nothing will be. What was sent still lands."""
        t = self.rooms[room]
        if t.status in (KVPoll.Success, KVPoll.Failed):
            return
        self.store.compare_set(_key(room, "state"), "", ABORTED)  # loses to SENT if the sender posted first
        self.store.set(_key(room, "abort"), json.dumps({"reason": reason, "status": int(status)}))
        t.unposted = []
        t.status, t.failure, t.failure_status = KVPoll.Failed, reason, int(status)

    def close(self, room: int, side: str) -> None:
        """This side is done with the room; drop it once nothing of it is in flight here."""
        self.rooms[room].open_sides.discard(side)
        self._drop_if_done(room)

    def _drop_if_done(self, room: int) -> None:
        t = self.rooms[room]
        if t.open_sides or not self.settled_locally(room):
            return
        del self.rooms[room]
        self.posted.pop(room, None)
        self.last_progress_s.pop(room, None)
        if self.audit is not None:
            self.audit.retire(t.uid)
        if self.store.add(_key(room, "closed"), 1) == 2:  # the second side to finish clears the room's keys
            for name in ROOM_KEYS:
                self.store.delete_key(_key(room, name))

    # -- progress -----------------------------------------------------------------------------
    def land_due(self) -> None:
        """Advance every room: the receiver posts irecvs for announced shipments; completed
        operations land (receiver) or finish (sender)."""
        if self.side == "receiver":
            for t in list(self.rooms.values()):
                if t.shipment is None and t.dst_pages is not None and self.room_state(t.room) == SENT:
                    self._post_receives(t)
        self._post_held()
        for room in list(self.posted):
            self._complete(room)
        for t in list(self.rooms.values()):
            self._check_timeout(t)

    def _post_receives(self, t: Transfer) -> None:
        meta = json.loads(self.store.get(_key(t.room, "shipment")))
        t.shipment = Shipment(meta["num_tokens"], meta["first_token"], meta["checksum"],
                              _decode_state(meta["sampler_state"]), meta["cached_tokens"])
        assert meta["dtype"] == str(self.pool.kv.dtype), f"prefill sends {meta['dtype']}, this pool holds {self.pool.kv.dtype}"
        L, two, _, ps, kvh, d = self.pool.kv.shape
        start = 0
        for i, n in enumerate(meta["batches"]):
            pages = t.dst_pages[start : start + n]
            start += n
            kv = torch.empty((L, two, n, ps, kvh, d), dtype=self.pool.kv.dtype, device=self.wire)  # (L, 2, n, page, KVH, D)
            ledger = torch.empty((2, n * ps), dtype=torch.long, device=self.wire)  # (2, n * page)
            works = [Completion(dist.irecv(kv, self.peer, tag=_tag(t.room, i, 0))),
                     Completion(dist.irecv(ledger, self.peer, tag=_tag(t.room, i, 1)))]
            self.posted.setdefault(t.room, []).append((works, pages, kv, ledger))
        t.in_flight = len(meta["batches"])
        self.last_progress_s[t.room] = time.monotonic()
        if t.status is not KVPoll.Failed:
            t.status = KVPoll.Transferring

    def _complete(self, room: int) -> None:
        """Land (or, on the sender, retire) every completed operation of `room`, in posting order."""
        t = self.rooms[room]
        pending = self.posted[room]
        while pending and all(w.done() for w in pending[0][0]):
            works, pages, kv, ledger = pending.pop(0)
            t.in_flight -= 1
            self.last_progress_s[room] = time.monotonic()
            try:
                for w in works:
                    w.result()
            except Exception as error:  # noqa: BLE001 - the peer is gone or the link broke: this batch never lands
                self.abort(room, f"KV transfer failed: {type(error).__name__}: {error}")
                continue
            if self.side == "receiver":
                self._land(t, pages, kv, ledger)
            if t.status is not KVPoll.Failed:
                t.pages_landed += len(pages)
        if not pending:
            del self.posted[room]
            if t.status is KVPoll.Transferring:
                t.status = KVPoll.Success
            if not t.open_sides:
                self._drop_if_done(room)

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
