"""One protocol suite, run against both transfer backends (transfer/base.py's `KVTransfer`).

Each scenario is a sender and a receiver written once, as generators that yield whenever they
wait on the other side or the network. The in-process driver runs both in one process over one
`KVManager`, a tick of its clock between rounds; the distributed driver runs each in its own
process over a `DistKVManager` (gloo on loopback), calling `land_due()` between rounds. The
assertions are the same for both: what the protocol promises, whichever backend carries it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from minikv.bench.transfer import PREFILL_RANK, make_pool, run_pair, wait_for
from minikv.disagg.checksum import kv_checksum
from minikv.disagg.transfer.base import KVPoll, KVReceiver, KVSender, KVTransfer, Shipment
from minikv.disagg.transfer.inprocess import KVManager
from minikv.disagg.transfer.torch_dist import DistKVManager
from minikv.engine.events import Clock, EventLog
from minikv.model.llama import ModelConfig

CONFIG = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                     num_kv_heads=2, head_dim=8, max_position_embeddings=64)
PAGE, POOL_PAGES = 4, 8
SRC_PAGES = [5, 2, 6]  # where prefill holds the prompt
NUM_TOKENS = 10  # the last page is partly filled
WRITER, ROOM = 7, 3  # the request's uid in both ledgers, and its room
NEXT_VALUE, NEXT_WRITER = 9.0, 99  # what another tenant's request writes into reused pages
TIMEOUT_S = 90  # for the four scenarios in one process pair


@dataclass
class Side:
    """One side of the transfer as a scenario sees it: its pool, audit and backend."""

    manager: KVTransfer
    pool: object
    audit: object


Script = Callable[[Side], Generator[None, None, dict]]


def until(condition: Callable[[], bool]) -> Generator[None, None, None]:
    while not condition():
        yield


def prefill_kv() -> torch.Tensor:
    g = torch.Generator().manual_seed(ROOM)
    return torch.randn((CONFIG.num_layers, 2, POOL_PAGES, PAGE, CONFIG.num_kv_heads, CONFIG.head_dim), generator=g)


def slots(pages: list[int]) -> torch.Tensor:
    return torch.tensor([p * PAGE + o for p in pages for o in range(PAGE)])  # (n * page,)


def send(side: Side) -> Generator[None, None, dict]:
    """Prefill: the prompt's KV and ledger in SRC_PAGES, sent once decode has advertised its pages."""
    side.pool.kv.copy_(prefill_kv())
    n = len(SRC_PAGES) * PAGE
    side.audit.record_writes(slots(SRC_PAGES), torch.full((n,), WRITER), torch.arange(n))
    sender = KVSender(side.manager, ROOM)
    yield from until(lambda: sender.poll() in (KVPoll.WaitingForInput, KVPoll.Failed))
    if sender.poll() is KVPoll.WaitingForInput:
        sender.init(len(SRC_PAGES))
        sender.send(SRC_PAGES, Shipment(NUM_TOKENS, 42, kv_checksum(side.pool, SRC_PAGES, NUM_TOKENS)))
    yield from until(lambda: sender.poll() in (KVPoll.Success, KVPoll.Failed))
    state = sender.poll()
    sender.close()
    return {"state": state}


def receive(side: Side, abort_when_sent: bool = False, deferred: bool = False) -> Generator[None, None, dict]:
    """Decode: advertise pages, then either receive, or abort once the write is on its way and
    hand the pages to the next request (waiting for the write to settle first if `deferred`)."""
    side.pool.kv.fill_(0.5)
    dst = side.pool.allocate(len(SRC_PAGES), "req")
    receiver = KVReceiver(side.manager, ROOM)
    receiver.send_metadata(dst)
    out = {"dst": dst}
    if abort_when_sent:
        yield from until(lambda: receiver.poll() is KVPoll.Transferring)
        receiver.abort("cancelled by the client", 499)
        out["settled_at_abort"] = side.manager.settled(ROOM)
        if deferred:
            yield from until(lambda: side.manager.settled(ROOM))
        side.pool.free(dst, "req")
        reused = side.pool.allocate(len(SRC_PAGES), "next")  # another tenant's request, into the freed pages
        side.pool.kv[:, :, reused] = NEXT_VALUE
        side.audit.record_writes(slots(reused), torch.full((len(reused) * PAGE,), NEXT_WRITER))
        out["reused_same_pages"] = reused == dst
        yield from until(lambda: side.manager.settled(ROOM))
    else:
        yield from until(lambda: receiver.poll() in (KVPoll.Success, KVPoll.Failed))
        out["settled_when_done"] = side.manager.settled(ROOM)
        yield from until(lambda: side.manager.settled(ROOM))  # a write still on its way lands first
    shipment = receiver.transfer.shipment
    out |= {"state": receiver.poll(), "failure": receiver.transfer.failure, "kv": side.pool.kv[:, :, dst].clone(),
            "writers": side.audit.writers[slots(dst)].clone(), "positions": side.audit.positions[slots(dst)].clone(),
            "shipment": (shipment.num_tokens, shipment.first_token, shipment.checksum) if shipment else None,
            "checksum_here": kv_checksum(side.pool, dst, NUM_TOKENS)}
    receiver.close()
    yield from until(lambda: ROOM not in side.manager.rooms)
    out["room_dropped"] = True
    return out


SCENARIOS: dict[str, tuple[Script, Script, dict]] = {  # sender, receiver, slow fabric or not
    "copy": (send, receive, {}),
    "late write, released at once": (send, lambda s: receive(s, abort_when_sent=True), {"slow": True}),
    "late write, deferred release": (send, lambda s: receive(s, abort_when_sent=True, deferred=True), {"slow": True}),
    "stalled": (send, receive, {"slow": True, "timeout": True}),
}


def run_in_process(name: str) -> tuple[dict, dict]:
    """Both sides over one KVManager; a tick of its clock (land_due) between rounds."""
    sender_script, receiver_script, fabric = SCENARIOS[name]
    (src, src_audit), (dst, dst_audit) = make_pool(CONFIG, POOL_PAGES, PAGE), make_pool(CONFIG, POOL_PAGES, PAGE)
    clock = Clock()
    manager = KVManager(src, dst, src_audit, dst_audit, EventLog(), clock, base_latency=6 if fabric.get("slow") else 1,
                        timeout_ticks=3 if fabric.get("timeout") else 16)
    manager.open_room(ROOM, "req", "tenant-a", WRITER)
    runs = [sender_script(Side(manager, src, src_audit)), receiver_script(Side(manager, dst, dst_audit))]
    results: list[dict | None] = [None, None]
    for _ in range(200):
        for i, run in enumerate(runs):
            if results[i] is None:
                try:
                    next(run)
                except StopIteration as done:
                    results[i] = done.value
        if all(r is not None for r in results):
            return results[0], results[1]
        manager.land_due()
        clock.advance()
    raise AssertionError(f"{name}: the in-process transfer never finished")


def _dist_scenario(rank: int, store: dist.Store, deadline: float, name: str) -> dict:
    sender_script, receiver_script, fabric = SCENARIOS[name]
    pool, audit = make_pool(CONFIG, POOL_PAGES, PAGE)
    slow = 1.0 if fabric.get("slow") else 0.0  # seconds per page on the link: 3 s for the room
    manager = DistKVManager("sender" if rank == PREFILL_RANK else "receiver", pool, audit, store, peer=1 - rank,
                            link_s_per_page=slow if rank == PREFILL_RANK else 0.0,
                            timeout_s=0.5 if fabric.get("timeout") and rank != PREFILL_RANK else None)
    manager.open_room(ROOM, "req", "tenant-a", WRITER)
    run = (sender_script if rank == PREFILL_RANK else receiver_script)(Side(manager, pool, audit))
    while True:
        if time.time() > deadline:
            raise TimeoutError(f"{name}: rank {rank} still waiting")
        try:
            next(run)
        except StopIteration as done:  # its writes may still be on the link: keep them moving until the room drops
            wait_for(lambda: (manager.land_due(), not manager.rooms)[1], deadline, "the room to drop")
            return done.value
        manager.land_due()
        time.sleep(0.001)


def _dist_worker(rank: int, store: dist.Store, deadline: float, names: tuple[str, ...]) -> dict:
    """The scenarios one after another, each with a manager of its own; the barrier lets the next one start
    only once both sides closed the room (and its keys left the store)."""
    results = {}
    for name in names:
        results[name] = _dist_scenario(rank, store, deadline, name)
        dist.barrier()
    return results


def run_distributed() -> dict[str, tuple[dict, dict]]:
    """Every scenario in one process pair: starting a pair (torch and minikv imported in both) costs more than a scenario."""
    sender, receiver = run_pair(_dist_worker, tuple(SCENARIOS), TIMEOUT_S)
    return {name: (sender[name], receiver[name]) for name in SCENARIOS}


@pytest.fixture(scope="module", params=["inprocess", "torch_dist"])
def backend(request):
    """Each scenario's (sender result, receiver result) on one backend, run once per module."""
    cache: dict[str, tuple[dict, dict]] = {}

    def results(name: str) -> tuple[dict, dict]:
        if name not in cache:
            cache.update(run_distributed() if request.param == "torch_dist" else {name: run_in_process(name)})
        return cache[name]

    return results


def test_pages_arrive_bit_identical_at_the_advertised_pages(backend):
    """Success on both sides; decode holds, at the pages it advertised, exactly prefill's pages, and the checksum agrees."""
    sender, receiver = backend("copy")
    assert sender["state"] is KVPoll.Success and receiver["state"] is KVPoll.Success and receiver["settled_when_done"]
    assert torch.equal(receiver["kv"], prefill_kv()[:, :, SRC_PAGES])
    assert receiver["checksum_here"] == receiver["shipment"][2]


def test_the_writer_ledger_and_shipment_travel_with_the_pages(backend):
    """The decode audit records prefill's writer and positions; num_tokens and the first token arrive; the room is dropped."""
    _, receiver = backend("copy")
    assert receiver["writers"].tolist() == [WRITER] * len(SRC_PAGES) * PAGE
    assert receiver["positions"].tolist() == list(range(len(SRC_PAGES) * PAGE))
    assert receiver["shipment"][:2] == (NUM_TOKENS, 42) and receiver["room_dropped"]


def test_an_abort_after_send_leaves_a_late_write_in_reused_pages(backend):
    """Aborted once the write is on its way, the room is not settled; freed at once, the pages go to
    the next request and the aborted request's KV and ledger land over it."""
    _, receiver = backend("late write, released at once")
    assert receiver["settled_at_abort"] is False and receiver["reused_same_pages"]
    assert torch.equal(receiver["kv"], prefill_kv()[:, :, SRC_PAGES])
    assert set(receiver["writers"].tolist()) == {WRITER}


def test_deferred_release_keeps_the_late_write_out_of_reused_pages(backend):
    """Waiting for settled() before reusing the pages leaves the next request's KV and ledger intact."""
    _, receiver = backend("late write, deferred release")
    assert receiver["settled_at_abort"] is False and receiver["reused_same_pages"]
    assert bool((receiver["kv"] == NEXT_VALUE).all()) and set(receiver["writers"].tolist()) == {NEXT_WRITER}


def test_a_stalled_transfer_times_out_into_a_failed_room(backend):
    """No progress for the timeout: the receiver's room is Failed (not Transferring forever) while the
    write is still on its way; it lands after all, and only then is the room dropped."""
    _, receiver = backend("stalled")
    assert receiver["state"] is KVPoll.Failed and "timed out" in receiver["failure"]
    assert receiver["settled_when_done"] is False
    assert receiver["room_dropped"] and torch.equal(receiver["kv"], prefill_kv()[:, :, SRC_PAGES])


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
    wait_for(lambda: sender.poll() is KVPoll.WaitingForInput, deadline + 3600, "never")  # only run_pair's timeout ends this
    return {}
