"""The distributed KV transfer between two real processes on loopback (gloo), bounded by a timeout."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from minikv.disagg.checksum import kv_checksum
from minikv.disagg.dist_pair import (
    PREFILL_RANK,
    make_pool,
    run_pair,
    transfer_one_room,
    wait_for,
)
from minikv.disagg.dist_transfer import ROOM_KEYS, SENT, DistKVManager
from minikv.disagg.transfer import KVPoll, KVReceiver, KVSender, Shipment
from minikv.model import ModelConfig

CONFIG = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                     num_kv_heads=2, head_dim=8, max_position_embeddings=64)
PAGE = 4
SRC_PAGES = [5, 2, 6]  # where prefill holds the prompt
NUM_TOKENS = 10  # the last page is partly filled
WRITER = 7  # the request's uid in both ledgers
TIMEOUT_S = 25


def prefill_kv(seed: int) -> torch.Tensor:
    """What the prefill pool holds, the same in every process for a seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn((CONFIG.num_layers, 2, 8, PAGE, CONFIG.num_kv_heads, CONFIG.head_dim), generator=g)  # (L, 2, P, page, KVH, D)


def _slots(pages: list[int]) -> torch.Tensor:
    return torch.tensor([p * PAGE + o for p in pages for o in range(PAGE)])  # (n * page,)


def _sender_side(store: dist.Store, deadline: float, rooms: list[tuple[int, int]]) -> dict:
    """Prefill: write KV for each (room, uid) into SRC_PAGES with its ledger, then send it."""
    pool, audit = make_pool(CONFIG, 8, PAGE)
    manager = DistKVManager("sender", pool, audit, store, peer=1)
    states = {}
    for room, uid in rooms:
        pool.kv.copy_(prefill_kv(seed=room))
        audit.record_writes(_slots(SRC_PAGES), torch.full((len(SRC_PAGES) * PAGE,), uid), torch.arange(len(SRC_PAGES) * PAGE))
        manager.open_room(room, f"req-{room}", "tenant-a", uid)
        checksum = kv_checksum(pool, SRC_PAGES, NUM_TOKENS)
        states[room] = transfer_one_room(manager, room, SRC_PAGES, deadline, Shipment(NUM_TOKENS, 42, checksum))
    wait_for(lambda: (manager.land_due(), not manager.rooms)[1], deadline, "every room to drop")
    return {"states": states}


def _copy_worker(rank: int, store: dist.Store, deadline: float, args: tuple) -> dict:
    if rank == PREFILL_RANK:
        return _sender_side(store, deadline, [(3, WRITER)])
    pool, audit = make_pool(CONFIG, 8, PAGE)
    pool.kv.fill_(0.5)
    manager = DistKVManager("receiver", pool, audit, store, peer=0)
    manager.open_room(3, "req-3", "tenant-a", WRITER)
    dst = pool.allocate(len(SRC_PAGES), "req-3")
    receiver = KVReceiver(manager, 3)
    receiver.send_metadata(dst)

    def done() -> bool:
        manager.land_due()
        return receiver.poll() in (KVPoll.Success, KVPoll.Failed)

    wait_for(done, deadline, "the room to land")
    shipment = receiver.transfer.shipment
    result = {"state": receiver.poll(), "dst": dst, "kv": pool.kv[:, :, dst].clone(),
              "writers": audit.writers[_slots(dst)].clone(), "positions": audit.positions[_slots(dst)].clone(),
              "shipment": (shipment.num_tokens, shipment.first_token, shipment.checksum), "checksum_here": kv_checksum(pool, dst, NUM_TOKENS)}
    receiver.close()
    result["rooms_left"] = len(manager.rooms)
    wait_for(lambda: not any(store.check([f"kv/3/{name}"]) for name in ROOM_KEYS), deadline, "the room's keys to go")
    return result


@pytest.fixture(scope="module")
def copied() -> tuple[dict, dict]:
    return run_pair(_copy_worker, (), TIMEOUT_S)


def test_pages_arrive_bit_identical_at_the_advertised_pages(copied):
    """The decode process's pool holds, at the pages it advertised, exactly the prefill process's pages."""
    prefill, decode = copied
    assert prefill["states"] == {3: KVPoll.Success} and decode["state"] is KVPoll.Success
    expected = prefill_kv(seed=3)[:, :, SRC_PAGES]  # (L, 2, 3, page, KVH, D)
    assert torch.equal(decode["kv"], expected)
    assert decode["checksum_here"] == decode["shipment"][2]


def test_writer_ledger_travels_with_the_pages(copied):
    """The decode audit records the prefill writer and positions of every slot that arrived."""
    _, decode = copied
    assert decode["writers"].tolist() == [WRITER] * len(SRC_PAGES) * PAGE
    assert decode["positions"].tolist() == list(range(len(SRC_PAGES) * PAGE))


def test_shipment_metadata_crosses_the_store(copied):
    """num_tokens and the first token arrive through the bootstrap store; after close the room and its keys are gone."""
    _, decode = copied
    assert decode["shipment"][:2] == (NUM_TOKENS, 42)
    assert decode["rooms_left"] == 0


B_VALUE, B_WRITER = 9.0, 99  # what the next request writes into the reused pages


def _late_write_worker(rank: int, store: dist.Store, deadline: float, args: tuple) -> dict:
    """Room 1 without deferred release, room 2 with it: decode cancels once prefill has sent."""
    if rank == PREFILL_RANK:
        return _sender_side(store, deadline, [(1, 11), (2, 12)])
    pool, audit = make_pool(CONFIG, len(SRC_PAGES), PAGE)  # as many pages as one request: reuse is certain
    manager = DistKVManager("receiver", pool, audit, store, peer=0)
    out = {}
    for room, uid, deferred in ((1, 11, False), (2, 12, True)):
        manager.open_room(room, f"req-{room}", "tenant-a", uid)
        dst = pool.allocate(len(SRC_PAGES), f"req-{room}")
        receiver = KVReceiver(manager, room)
        receiver.send_metadata(dst)
        wait_for(lambda room=room: manager.room_state(room) == SENT, deadline, "prefill to send")  # the write is in the network
        receiver.abort("cancelled by the client", 499)
        settled_at_abort = manager.settled_locally(room)
        if deferred:
            wait_for(lambda room=room: manager.settled(room), deadline, "the in-flight write to land")
        pool.free(dst, f"req-{room}")
        reused = pool.allocate(len(SRC_PAGES), "req-b")  # the next request, another tenant's
        pool.kv[:, :, reused] = B_VALUE
        audit.record_writes(_slots(reused), torch.full((len(reused) * PAGE,), B_WRITER))
        receiver.close()
        wait_for(lambda room=room: (manager.land_due(), room not in manager.rooms)[1], deadline, "the room to drop")
        out[room] = {"settled_at_abort": settled_at_abort, "same_pages": reused == dst,
                     "kv": pool.kv[:, :, reused].clone(), "writers": audit.writers[_slots(reused)].clone(),
                     "late": [r for r, *_ in manager.landed_late]}
        pool.free(reused, "req-b")
    return out


@pytest.fixture(scope="module")
def cancelled() -> dict:
    return run_pair(_late_write_worker, (), TIMEOUT_S)[1]


def test_cancel_after_send_is_not_settled(cancelled):
    """A cancel once prefill has sent leaves a write in the network: the room is not settled."""
    assert cancelled[1]["settled_at_abort"] is False and cancelled[2]["settled_at_abort"] is False


def test_late_write_lands_in_reused_pages_without_deferred_release(cancelled):
    """Freed at once, the pages go to the next request and the cancelled request's KV overwrites it."""
    room = cancelled[1]
    assert room["same_pages"]
    assert torch.equal(room["kv"], prefill_kv(seed=1)[:, :, SRC_PAGES])
    assert set(room["writers"].tolist()) == {11}
    assert 1 in room["late"]


def test_deferred_release_keeps_the_late_write_out_of_reused_pages(cancelled):
    """Holding the pages until the write lands leaves the next request's KV and ledger intact."""
    room = cancelled[2]
    assert room["same_pages"]
    assert bool((room["kv"] == B_VALUE).all())
    assert set(room["writers"].tolist()) == {B_WRITER}


def test_a_lost_peer_times_out_instead_of_hanging():
    """A receiver that never advertises pages makes run_pair raise within its timeout."""
    start = time.time()
    with pytest.raises(TimeoutError):
        run_pair(_never_advertised, (), timeout_s=6)
    assert time.time() - start < 20


def _never_advertised(rank: int, store: dist.Store, deadline: float, args: tuple) -> dict:
    pool, audit = make_pool(CONFIG, 8, PAGE)
    manager = DistKVManager("sender" if rank == PREFILL_RANK else "receiver", pool, audit, store, peer=1 - rank)
    manager.open_room(1, "req-1", "tenant-a", 1)
    if rank != PREFILL_RANK:
        time.sleep(3600)  # the decode worker is stuck: it never advertises its pages
    sender = KVSender(manager, 1)
    while sender.poll() is not KVPoll.WaitingForInput:
        time.sleep(0.01)  # no deadline on purpose: only run_pair's timeout can end this
    return {}


SLOW_LINK_S_PER_PAGE, TRANSFER_TIMEOUT_S = 1.0, 0.5  # the write takes 3 s on the link; the receiver waits 0.5 s


def _timeout_worker(rank: int, store: dist.Store, deadline: float, args: tuple) -> dict:
    """A slow link (3 s for the room) against a receiver that gives up after 0.5 s without progress."""
    if rank == PREFILL_RANK:
        pool, audit = make_pool(CONFIG, 8, PAGE)
        manager = DistKVManager("sender", pool, audit, store, peer=1, link_s_per_page=SLOW_LINK_S_PER_PAGE)
        manager.open_room(1, "req-1", "tenant-a", 1)
        transfer_one_room(manager, 1, SRC_PAGES, deadline, Shipment(NUM_TOKENS, 42, None))
        wait_for(lambda: (manager.land_due(), not manager.rooms)[1], deadline, "the room to drop")
        return {}
    pool, audit = make_pool(CONFIG, 8, PAGE)
    manager = DistKVManager("receiver", pool, audit, store, peer=0, timeout_s=TRANSFER_TIMEOUT_S)
    manager.open_room(1, "req-1", "tenant-a", 1)
    receiver = KVReceiver(manager, 1)
    receiver.send_metadata(pool.allocate(len(SRC_PAGES), "req-1"))
    wait_for(lambda: (manager.land_due(), receiver.poll() is KVPoll.Transferring)[1], deadline, "the transfer to start")
    started = time.monotonic()
    wait_for(lambda: (manager.land_due(), receiver.poll() is not KVPoll.Transferring)[1], deadline, "the transfer to end")
    out = {"state": receiver.poll(), "after_s": time.monotonic() - started, "reason": receiver.transfer.failure,
           "settled_at_timeout": manager.settled_locally(1)}
    wait_for(lambda: manager.settled(1), deadline, "the write to land after all")
    out["late"] = [room for room, *_ in manager.landed_late]
    receiver.close()
    return out


def test_a_stalled_transfer_times_out_into_a_failed_room():
    """No progress for timeout_s: the room is Failed (not Transferring forever), and the write still lands later."""
    _, decode = run_pair(_timeout_worker, (), TIMEOUT_S)
    assert decode["state"] is KVPoll.Failed and "timed out" in decode["reason"]
    assert TRANSFER_TIMEOUT_S <= decode["after_s"] < len(SRC_PAGES) * SLOW_LINK_S_PER_PAGE
    assert decode["settled_at_timeout"] is False and decode["late"] == [1]
