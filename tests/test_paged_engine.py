"""The paged engine: page pool, paged attention, scheduler, admission control, audit."""

from __future__ import annotations

import random

import pytest
import torch

from minikv.engine.config import EngineConfig
from minikv.model.decoding import generate_with_cache
from minikv.engine.engine import Engine
from minikv.model.llama import ModelConfig
from minikv.engine.page_pool import PagePool, PoolExhausted
from minikv.engine.paged_step import PagedStep, SeqSlice, paged_attention_reference
from minikv.engine.request import Request
from minikv.model.sampling import SamplingParams

SMALL = ModelConfig(vocab_size=10, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=4, max_position_embeddings=64)


def test_pool_hands_out_each_page_once_and_takes_it_back():
    """allocate/free keep free list and owners consistent; the most recently freed come first."""
    pool = PagePool(SMALL, num_pages=8, page_size=4)
    a = pool.allocate(3, "a")
    b = pool.allocate(2, "b")
    assert set(a).isdisjoint(b) and pool.num_free_pages == 3
    pool.free(a, "a")
    pool.check_integrity()
    assert pool.allocate(3, "c") == a  # same pages, same order: the stale data lines up
    with pytest.raises(PoolExhausted):
        pool.allocate(4, "d")


def test_freed_pages_keep_their_data():
    """Freeing a page does not zero it (the performance choice the incident turned on)."""
    pool = PagePool(SMALL, num_pages=4, page_size=4)
    pages = pool.allocate(1, "a")
    pool.kv[:, :, pages] = 7.0
    pool.free(pages, "a")
    assert bool((pool.kv[:, :, pages] == 7.0).all())


def test_scrub_on_free_zeroes_pages():
    """The costly option: scrub_on_free clears a page when it is released."""
    pool = PagePool(SMALL, num_pages=4, page_size=4, scrub_on_free=True)
    pages = pool.allocate(1, "a")
    pool.kv[:, :, pages] = 7.0
    pool.free(pages, "a")
    assert bool((pool.kv[:, :, pages] == 0).all())


def test_paged_attention_matches_reference():
    """The batched gather+SDPA path equals the slot-by-slot reference on a mixed batch."""
    torch.manual_seed(0)
    fast, slow = PagePool(SMALL, 16, 4), PagePool(SMALL, 16, 4)
    init = torch.randn_like(fast.kv)
    fast.kv.copy_(init)
    slow.kv.copy_(init)
    seqs = [SeqSlice(1, [3, 7, 1], 5, 4), SeqSlice(2, [0, 2], 7, 1), SeqSlice(3, [9, 10, 11, 12], 0, 13)]
    N = sum(s.num_new for s in seqs)
    q, k, v = torch.randn(N, 4, 4), torch.randn(N, 2, 4), torch.randn(N, 2, 4)
    out_fast = PagedStep(fast, seqs).attend(1, q, k, v)
    out_slow = paged_attention_reference(slow, 1, seqs, q, k, v)
    assert torch.allclose(out_fast, out_slow, atol=1e-6)
    assert torch.equal(fast.kv, slow.kv)


def test_paged_engine_matches_contiguous_reference(tiny):
    """Greedy outputs of a batched paged run equal one-at-a-time contiguous decoding."""
    model, tok = tiny
    rng = random.Random(1)
    from minikv.attacks.workload import note_prompt, random_note

    prompts = [note_prompt(rng.choice(["alice", "bob", "carol"]), random_note(rng)) for _ in range(8)]
    engine = Engine(model, tok, EngineConfig(num_pages=64))
    responses = engine.generate(prompts, max_tokens=48)
    for p, r in zip(prompts, responses):
        ref = generate_with_cache(model, tok.encode(p), 48, tok.eos_token_id)
        assert r.status == 200
        assert r.usage.completion_tokens == len(ref)
        assert r.text == tok.decode([t for t in ref if t != tok.eos_token_id])


def test_pool_whole_and_audit_zero_after_a_drained_workload(tiny):
    """After every request finished: all pages free, no page owned twice, no cross read."""
    model, tok = tiny
    engine = Engine(model, tok, EngineConfig(num_pages=12, max_batch_size=4))
    rng = random.Random(2)
    from minikv.attacks.workload import note_prompt, random_note

    done = []
    for i in range(10):
        engine.submit(Request(note_prompt("t%d" % i, random_note(rng)), tenant=f"t{i}", max_tokens=rng.randint(1, 40)))
        done += engine.step()
        engine.check_integrity()
    done += engine.run()
    assert engine.pool.num_free_pages == engine.pool.num_pages
    engine.check_integrity()
    assert engine.audit.violations == 0
    assert len(done) == 10 and all(r.status == 200 for r in done)


def test_small_pool_makes_requests_wait_or_preempt_not_fail(tiny):
    """A pool that fits one request at a time still answers every request, correctly."""
    model, tok = tiny
    prompts = ["alice: save pin 0912.\n", "bob: save card 4111 2222 3333 4444.\n", "carol: save key sk-abc.\n"]
    tight = Engine(model, tok, EngineConfig(num_pages=5, page_size=16))
    roomy = Engine(model, tok, EngineConfig(num_pages=64, page_size=16))
    got, want = tight.generate(prompts, max_tokens=40), roomy.generate(prompts, max_tokens=40)
    assert [r.text for r in got] == [r.text for r in want]
    assert all(r.status == 200 for r in got)
    assert tight.pool.num_free_pages == 5 and tight.audit.violations == 0


def test_corrupted_block_table_makes_the_audit_fire(tiny):
    """Point bob's block table at alice's page on purpose: the audit reports a cross-tenant read."""
    model, tok = tiny
    engine = Engine(model, tok, EngineConfig(num_pages=16))
    engine.submit(Request("alice: save pin 0912.\n", tenant="alice", request_id="a", max_tokens=30))
    engine.submit(Request("bob: save memo hi.\n", tenant="bob", request_id="b", max_tokens=30))
    engine.step()  # both prefilled
    alice, bob = engine.seqs["a"], engine.seqs["b"]
    bob.block_table[0] = alice.block_table[0]  # the bookkeeping slip
    engine.step()
    events = engine.audit.events
    assert engine.audit.cross_tenant_reads > 0
    assert events[0].reader == "b" and events[0].victim == "a" and alice.block_table[0] in events[0].pages


BAD_REQUESTS = [
    (Request("", tenant="x"), "empty prompt"),
    (Request("x" * 1100 + "\n", tenant="x"), "context window is 1024"),
    (Request("x" * 500 + "\n", tenant="x", max_tokens=10), "node's pool holds at most 256 tokens"),
    (Request("héllo\n", tenant="x"), "outside the model's vocabulary"),
    (Request("hi\n", tenant="x", max_tokens=0), "max_tokens must be a positive integer"),
    (Request("hi\n", tenant="x", max_tokens=-3), "max_tokens must be a positive integer"),
    (Request("hi\n", tenant="x", max_tokens=10**9), "exceeds the context window"),
    (Request("hi\n", tenant="x", sampling=SamplingParams(temperature=-1.0)), "temperature"),
    (Request("hi\n", tenant="x", sampling=SamplingParams(temperature=float("nan"))), "temperature"),
    (Request("hi\n", tenant="x", sampling=SamplingParams(temperature=1.0, top_p=0.0)), "top_p"),
    (Request("hi\n", tenant=""), "tenant"),
    (Request("hi\n", tenant="x", max_tokens="12"), "max_tokens"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("request_, reason", BAD_REQUESTS)
def test_bad_request_gets_400_and_engine_keeps_serving(tiny, request_, reason):
    """Each bad request is answered 400 with its reason; a good one beside it is served."""
    model, tok = tiny
    engine = Engine(model, tok, EngineConfig(num_pages=16))
    bad = engine.submit(request_)
    good = engine.submit(Request("alice: save pin 0912.\n", tenant="alice", max_tokens=20))
    done = {r.request_id: r for r in engine.run()}
    assert done[bad].status == 400 and reason in done[bad].error
    assert done[good].status == 200
    assert engine.pool.num_free_pages == 16


def test_duplicate_request_id_is_refused(tiny):
    """A second live request with the same id from the same tenant gets 400; the first is unaffected."""
    model, tok = tiny
    engine = Engine(model, tok, EngineConfig(num_pages=16))
    engine.submit(Request("alice: save pin 0912.\n", tenant="alice", request_id="r1", max_tokens=20))
    engine.submit(Request("alice: save pin 1.\n", tenant="alice", request_id="r1", max_tokens=20))
    done = engine.run()
    assert [r.status for r in done] == [400, 200]
    assert "duplicate request_id" in done[0].error
    assert [r.client_request_id for r in done] == ["r1", "r1"] and done[0].request_id != done[1].request_id


def test_cancel_mid_decode_frees_pages(tiny):
    """Cancelling a decoding request answers 499 at once and returns all its pages."""
    model, tok = tiny
    engine = Engine(model, tok, EngineConfig(num_pages=16))
    rid = engine.submit(Request("alice: save card 4111 2222 3333 4444.\n", tenant="alice", max_tokens=40))
    other = engine.submit(Request("bob: save pin 1234.\n", tenant="bob", max_tokens=40))
    for _ in range(3):
        engine.step()
    assert engine.cancel(rid)
    done = {r.request_id: r for r in engine.run()}
    assert done[rid].status == 499 and done[other].status == 200
    assert engine.pool.num_free_pages == 16 and not engine.cancel(rid)


def test_config_errors_name_the_numbers():
    """Invalid engine configurations fail at construction with a message naming the values."""
    with pytest.raises(ValueError, match="num_pages must be >= 1"):
        EngineConfig(num_pages=0)
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        EngineConfig(page_size=0)
    with pytest.raises(ValueError, match="holds less than one page"):
        EngineConfig(num_pages=None, kv_memory_bytes=10).pool_pages(SMALL)
