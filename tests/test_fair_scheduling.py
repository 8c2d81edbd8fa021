"""Fair admission across tenants (engine/fairness.py): the least served tenant's request goes first."""

from __future__ import annotations

from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.engine.fairness import OUTPUT_WEIGHT, PROMPT_WEIGHT, VirtualTokenCounter
from minikv.engine.request import Request

LONG = "alice: read " + "the quarterly report and the budget review " * 20 + "\n"  # about 870 tokens


def note(tenant: str, i: int) -> str:
    return f"{tenant}: save pin {i:04d}.\n"  # 23 tokens


def admission_order(engine: Engine, ids: dict[str, str]) -> list[str]:
    """Run `engine` dry; the tenants of `ids` (keyed by engine id) in the order their requests got pages."""
    engine.run()
    firsts = [e.request_id for e in engine.log.of_kind("allocate") if e.detail.endswith("tokens")]
    return [ids[r] for r in firsts if r in ids]


def test_b_one_request_goes_before_as_queued_thirty(tiny):
    """A queues 30 requests, then B sends one: B's is admitted second (A's first one puts A's counter
    above B's), not after all 30 of A's as first come, first served would."""
    engine = Engine(*tiny, EngineConfig(num_pages=128, max_prefill_tokens=64))
    ids = {engine.submit(Request(note("alice", i), "alice", 4)): "alice" for i in range(30)}
    ids[engine.submit(Request(note("bob", 0), "bob", 4))] = "bob"
    order = admission_order(engine, ids)
    assert order.index("bob") == 1, order
    assert len(order) == 31


def test_counters_are_weighted_service(tiny):
    """After one request, a tenant's counter is its prompt tokens plus OUTPUT_WEIGHT per generated token."""
    engine = Engine(*tiny, EngineConfig(num_pages=64))
    engine.submit(Request(note("alice", 1), "alice", 5))
    [r] = engine.run()
    counters = engine.scheduler.fairness.counters
    usage = r.usage
    assert counters["alice"] == PROMPT_WEIGHT * usage.prompt_tokens + OUTPUT_WEIGHT * usage.completion_tokens
    assert r.usage.completion_tokens == 5


def test_lift_rule():
    """A tenant that (re)arrives is lifted to the least counter among active tenants, never lowered; one
    that is active keeps its own; with nobody active, it is lifted to the largest counter."""
    vtc = VirtualTokenCounter()
    vtc.charge("alice", prompt_tokens=300)
    vtc.charge("carol", prompt_tokens=100)
    vtc.arrive("bob", active={"alice", "carol"})
    assert vtc.counters["bob"] == 100  # idle, it banked nothing
    vtc.charge("bob", prompt_tokens=900)
    vtc.arrive("bob", active={"alice", "carol"})
    assert vtc.counters["bob"] == 1000  # never lowered
    vtc.arrive("carol", active={"carol"})
    assert vtc.counters["carol"] == 100  # active: no lift
    vtc.arrive("dave", active=set())
    assert vtc.counters["dave"] == 1000


def test_idle_tenant_banks_no_credit(tiny):
    """B is served once, idles while A is served 20 requests, then both queue ten: B gets about half of the
    first ten admissions (it was lifted to A's counter), not all ten on the credit of its idle time."""
    engine = Engine(*tiny, EngineConfig(num_pages=128, max_prefill_tokens=48))
    engine.submit(Request(note("bob", 99), "bob", 2))
    engine.run()
    for i in range(20):
        engine.submit(Request(note("alice", 100 + i), "alice", 2))
    engine.run()
    ids = {}
    for i in range(10):
        ids[engine.submit(Request(note("alice", i), "alice", 2))] = "alice"
    for i in range(10):
        ids[engine.submit(Request(note("bob", i), "bob", 2))] = "bob"
    order = admission_order(engine, ids)
    assert 4 <= order[:10].count("bob") <= 6, " ".join(order)  # without the lift: 10; with FCFS: 0


def test_b_takes_the_first_free_batch_slot(tiny):
    """With every batch slot held by A and ten more of A's queued, B's takes the first slot that frees."""
    engine = Engine(*tiny, EngineConfig(num_pages=128, max_batch_size=4))
    ids = {engine.submit(Request(note("alice", i), "alice", 12)): "alice" for i in range(14)}
    engine.step()  # four of A's are prefilled and decoding; every slot is taken
    ids[engine.submit(Request(note("bob", 0), "bob", 4))] = "bob"
    assert admission_order(engine, ids).index("bob") == 4


def test_b_goes_before_a_chunked_prefill_going_on(tiny):
    """With chunked prefill, B's short prompt arriving during A's long one is prefilled in the very next
    step, on its own (B has nothing running: a newcomer), not after A's chunks nor beside one of them."""
    engine = Engine(*tiny, EngineConfig(num_pages=128, max_prefill_tokens=128, chunked_prefill=True))
    alice = engine.submit(Request(LONG, "alice", 4))
    engine.step()  # A's first chunk
    bob = engine.submit(Request(note("bob", 0), "bob", 4))
    engine.run()
    prefills = [e for e in engine.log.of_kind("write") if e.detail.startswith("prefill")]
    bob_step = next(e.step for e in prefills if e.request_id == bob)
    alice_steps = sorted({e.step for e in prefills if e.request_id == alice})
    assert bob_step == alice_steps[0] + 1 and bob_step not in alice_steps, (bob_step, alice_steps)
    assert len(alice_steps) >= 7


def test_newcomer_skips_the_decode_turn_and_steps_alone(tiny):
    """Beside A's requests decoding and more of A's queued, B's prompt arriving just after a prefill step gets
    its first token from the very next step, which prefills B's prompt alone: not after the decode step that
    follows every prefill step with chunks, and not in a step topped up with A's prompts."""
    engine = Engine(*tiny, EngineConfig(num_pages=256, max_prefill_tokens=128, chunked_prefill=True))
    for i in range(4):
        engine.submit(Request(note("alice", i), "alice", 40))
    engine.step()  # a prefill step: A's four now decode
    for i in range(4, 8):
        engine.submit(Request(note("alice", i), "alice", 40))
    bob = engine.submit(Request(note("bob", 0), "bob", 4))
    engine.step()
    assert len(engine.seqs[bob].output_ids) == 1, "B's first token did not come from the next step"
    step = engine.log.of_kind("write")[-1].step
    tenants = {e.tenant for e in engine.log.of_kind("write") if e.step == step}
    assert tenants == {"bob"}, tenants


def test_prefill_node_steps_a_newcomer_alone(tiny):
    """`schedule_prefill`, as the pair's prefill node calls it with chunks: with A's prompts queued, B (a
    newcomer) gets a step of its own prompt, not one the token budget fills up with A's."""
    engine = Engine(*tiny, EngineConfig(num_pages=256, max_prefill_tokens=128, chunked_prefill=True))
    for i in range(8):
        engine.submit(Request(note("alice", i), "alice", 40))
    engine.step()  # six of A's are running (the sixth in part); two wait
    engine.submit(Request(note("bob", 0), "bob", 4))
    batch = engine.scheduler.schedule_prefill()
    assert batch is not None and [s.tenant for s in batch.seqs] == ["bob"], [s.tenant for s in batch.seqs]


def test_whole_prompts_take_no_newcomer_step(tiny):
    """Without chunks the scheduler keeps its full budget: B's prompt is prefilled beside A's queued ones."""
    engine = Engine(*tiny, EngineConfig(num_pages=256, max_prefill_tokens=128))
    for i in range(8):
        engine.submit(Request(note("alice", i), "alice", 40))
    engine.step()
    engine.submit(Request(note("bob", 0), "bob", 4))
    batch = engine.scheduler.schedule_prefill()
    assert batch is not None and {s.tenant for s in batch.seqs} == {"alice", "bob"}


def test_the_pairs_prefill_node_admits_fairly(tiny):
    """The disaggregated prefill node reuses the scheduler: there too B's request goes second, not 31st."""
    cluster = Cluster(*tiny, ClusterConfig(context_len=672, max_prefill_tokens=64))
    ids = {cluster.submit(Request(note("alice", i), "alice", 4)): "alice" for i in range(30)}
    ids[cluster.submit(Request(note("bob", 0), "bob", 4))] = "bob"
    assert {r.status for r in cluster.run()} == {200}
    order = [ids[e.request_id] for e in cluster.log.of_kind("allocate") if e.node == "prefill"]
    assert order.index("bob") == 1, order
