"""Prefix caching: keys, ref counts, LRU, equal outputs, the audit's view, and cache_salt."""

from __future__ import annotations

import random

import pytest
import torch

from minikv.engine.audit import OwnershipAudit
from minikv.engine.config import EngineConfig
from minikv.attacks.fuzz import first_failing, run_workload, targets, tiny_random_model
from minikv.engine.engine import Engine
from minikv.model.llama import ModelConfig
from minikv.engine.page_pool import PagePool
from minikv.engine.prefix_cache import cache_salt, page_keys, page_keys_reference
from minikv.engine.request import Request

MODEL, TOK = tiny_random_model()
TINY = ModelConfig(vocab_size=4, hidden_size=4, intermediate_size=4, num_layers=1, num_heads=1,
                   num_kv_heads=1, head_dim=2, max_position_embeddings=8)
LETTERS = "abcdefgh"


# -- keys -----------------------------------------------------------------------------------
def test_chained_keys_are_equal_exactly_when_prefixes_are():
    """page_keys (a chain) and the slow whole-prefix hash agree on which page keys are equal."""
    rng = random.Random(0)
    for _ in range(200):
        page = rng.choice([1, 2, 4])
        a = [rng.randrange(3) for _ in range(rng.randint(0, 12))]
        b = a[: rng.randint(0, len(a))] + [rng.randrange(3) for _ in range(rng.randint(0, 6))]
        salts = (rng.choice([None, "x"]), rng.choice([None, "x", "y"]))
        fast = [k1 == k2 for k1, k2 in zip(page_keys(a, page, salts[0]), page_keys(b, page, salts[1]))]
        slow = [k1 == k2 for k1, k2 in zip(page_keys_reference(a, page, salts[0]), page_keys_reference(b, page, salts[1]))]
        assert fast == slow
        assert len(page_keys(a, page)) == len(a) // page  # full pages only


def test_cache_salt_namespaces():
    """With the switch on, the tenant is always in the salt; off, only the request's own salt."""
    assert cache_salt("alice", None, per_tenant=False) is None
    assert cache_salt("alice", "s", per_tenant=False) == cache_salt("bob", "s", per_tenant=False)
    assert cache_salt("alice", None, per_tenant=True) != cache_salt("bob", None, per_tenant=True)
    assert cache_salt("alice", "s", per_tenant=True) != cache_salt("alice", None, per_tenant=True)


# -- the pool: ref counts and the order pages come back in ------------------------------------
def test_page_without_key_goes_back_on_the_stack_as_before():
    """Uncached pages keep the stack order the leak notebooks describe, caching on or off."""
    for caching in (False, True):
        pool = PagePool(TINY, 8, 4, prefix_caching=caching)
        alice = pool.allocate(3, "alice")
        pool.free(alice, "alice")
        assert pool.allocate(3, "bob") == alice


def test_cached_pages_are_parked_and_evicted_least_recently_used_first():
    """Stack first; then parked cached pages, oldest first; a held page is never handed out."""
    pool = PagePool(TINY, 4, 1, prefix_caching=True)
    keys = page_keys([1, 2, 3], 1)
    pages = pool.allocate(3, "a")
    assert pool.prefix_cache.cache_pages(keys, pages, 3) == pages
    pool.free(pages, "a")  # freed in reverse: the last page parks first, so it is evicted first
    assert pool.num_free_pages == 4 and pool.free_pages == [3]
    pool.allocate(0, "b", cached=[pages[0]])  # a hit: page 0 held again
    assert pool.allocate(1, "c") == [3]  # the stack first
    assert pool.allocate(2, "d") == [pages[2], pages[1]]  # then LRU, never the held page 0
    assert pool.prefix_cache.match(keys, 4) == [pages[0]]  # evicted pages lost their keys
    assert not pool.can_allocate(1)
    pool.check_integrity()


def test_shared_page_stays_held_until_its_last_holder_frees_it():
    """Ref counts: a page two requests hold is freed only by the second free."""
    pool = PagePool(TINY, 2, 1, prefix_caching=True)
    page = pool.allocate(1, "a")
    pool.prefix_cache.cache_pages(page_keys([5], 1), page, 1)
    pool.allocate(0, "b", cached=page)
    assert pool.ref_count(page[0]) == 2
    pool.free(page, "a")
    assert pool.ref_count(page[0]) == 1 and pool.num_free_pages == 1
    with pytest.raises(AssertionError):
        pool.free(page, "a")  # a does not hold it any more
    pool.free(page, "b")
    assert pool.num_free_pages == 2
    pool.check_integrity()


def test_the_last_token_is_never_taken_from_the_cache():
    """A prompt whose every page is cached still computes its last page (its logits pick the token)."""
    pool = PagePool(TINY, 8, 2, prefix_caching=True)
    ids = [1, 2, 3, 0]
    pages = pool.allocate(2, "a")
    pool.prefix_cache.cache_pages(page_keys(ids, 2), pages, 4)
    assert pool.prefix_cache.match(page_keys(ids, 2), 4) == pages[:1]
    assert pool.prefix_cache.match(page_keys(ids + [1], 2), 5) == pages


# -- the engine: outputs, usage, bookkeeping -----------------------------------------------------
def shared_prefix_mix(rng: random.Random) -> list[tuple[str, str, int]]:
    """(prompt, tenant, max_tokens): a few stems shared by many requests, as system prompts are."""
    stems = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 40))) for _ in range(rng.randint(1, 3))]
    return [(rng.choice(stems) + "".join(rng.choice(LETTERS) for _ in range(rng.randint(0, 12))) + "\n",
             rng.choice(["alice", "bob"]), rng.randint(1, 12)) for _ in range(rng.randint(2, 10))]


def serve(mix, rng_seed: int, **config) -> tuple[Engine, list]:
    """Submit `mix` over a few steps (arrivals interleave with decoding), run to the end."""
    engine = Engine(MODEL, TOK, EngineConfig(context_len=96, **config), node="n")
    rng, ids, pending, answered = random.Random(rng_seed), [], list(mix), {}
    while pending or engine.has_work():
        for _ in range(rng.randint(0, 3)):
            if pending:
                prompt, tenant, max_tokens = pending.pop(0)
                ids.append(engine.submit(Request(prompt, tenant, max_tokens)))
        answered |= {r.request_id: r for r in engine.step()}
        engine.check_integrity()
    return engine, [answered[i] for i in ids]


def test_outputs_identical_with_prefix_caching_on_and_off():
    """60 random mixes of shared prefixes on small pools (preemption included): same tokens."""
    hits = preemptions = 0
    for seed in range(60):
        rng = random.Random(seed)
        mix, config = shared_prefix_mix(rng), dict(page_size=rng.choice([1, 2, 4]), num_pages=rng.randint(30, 60),
                                                   cache_salt=rng.random() < 0.5)
        off_engine, off = serve(mix, seed, prefix_caching=False, **config)
        on_engine, on = serve(mix, seed, prefix_caching=True, **config)
        assert [(r.status, r.text, r.usage.completion_tokens) for r in on] == \
               [(r.status, r.text, r.usage.completion_tokens) for r in off], f"mix {seed}"
        hits += sum(r.usage.cached_tokens > 0 for r in on)
        preemptions += len(on_engine.log.of_kind("preempt"))
        assert on_engine.audit.violations == 0 and off_engine.audit.violations == 0
    assert hits > 50 and preemptions > 10  # the mixes really shared pages and really preempted


def test_pool_consistent_after_every_drained_workload():
    """Once drained: no holder left, every page free (stack or parked), the index consistent."""
    for seed in range(20):
        rng = random.Random(100 + seed)
        engine, _ = serve(shared_prefix_mix(rng), seed, page_size=rng.choice([1, 2, 4]), num_pages=rng.randint(30, 60))
        pool = engine.pool
        pool.check_integrity()
        assert not any(pool.holders) and pool.num_free_pages == pool.num_pages
        assert len(pool.free_pages) + pool.prefix_cache.num_parked == pool.num_pages


def test_cached_tokens_in_usage_and_cache_hit_event():
    """The second identical prompt reuses every full page but the last token's; usage says so."""
    engine = Engine(MODEL, TOK, EngineConfig(page_size=4, num_pages=32, context_len=96))
    [first] = engine.generate(["abcdefghij\n"], max_tokens=2)
    [second] = engine.generate(["abcdefghij\n"], max_tokens=2)
    assert first.usage.cached_tokens == 0 and second.usage.cached_tokens == 8  # 11 tokens: 2 full pages of 4
    hit = engine.log.of_kind("cache_hit")
    assert len(hit) == 1 and hit[0].request_id == second.request_id and len(hit[0].pages) == 2


def test_logits_with_cached_prefix_match_transformers():
    """The shipped model: a prompt whose prefix came from the cache gives transformers' logits."""
    from minikv.model.checkpoint import load_model, to_hf_model

    model, tok = load_model(device="cpu")
    hf = to_hf_model(model, tok)
    engine = Engine(model, tok, EngineConfig(page_size=4, num_pages=64, cache_salt=False))
    engine.generate(["alice: read the report. save pin 0912.\n"], max_tokens=1, tenant="alice")
    captured = []
    handle = model.register_forward_hook(lambda mod, args, out: captured.append(out))
    prompt = "alice: read the report. save pin 4455.\n"
    [response] = engine.generate([prompt], max_tokens=1, tenant="bob")
    handle.remove()
    assert response.usage.cached_tokens == 32  # "alice: read the report. save pin " is 33 characters
    ids = tok.encode(prompt, add_special_tokens=False)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0, -1]  # (V,)
    torch.testing.assert_close(captured[0][0], want, atol=1e-4, rtol=1e-4)


def test_scrubbed_pages_are_never_hits():
    """scrub_on_free zeroes what a freed page holds, so it must also drop the page's key."""
    engine = Engine(MODEL, TOK, EngineConfig(page_size=2, num_pages=32, context_len=96, scrub_on_free=True))
    engine.generate(["abcdefgh\n"], max_tokens=1)
    [again] = engine.generate(["abcdefgh\n"], max_tokens=1)
    assert again.usage.cached_tokens == 0


# -- isolation: the salt, the audit ------------------------------------------------------------------
def test_cache_salt_switch_keeps_tenants_apart_and_request_salt_narrows():
    """Salt on: no hit across tenants; same tenant shares unless request salts differ."""
    def cached(cache_salt_on: bool, *requests: Request) -> list[int]:
        engine = Engine(MODEL, TOK, EngineConfig(page_size=2, num_pages=64, context_len=96, cache_salt=cache_salt_on))
        out = []
        for r in requests:
            engine.submit(r)
            out += [x.usage.cached_tokens for x in engine.run()]
        assert engine.audit.violations == 0
        return out

    p = "abcdefgh\n"
    assert cached(False, Request(p, "alice", 1), Request(p, "bob", 1)) == [0, 8]
    assert cached(True, Request(p, "alice", 1), Request(p, "bob", 1)) == [0, 0]
    assert cached(True, Request(p, "alice", 1), Request(p, "alice", 1)) == [0, 8]
    assert cached(True, Request(p, "alice", 1, cache_salt="a"), Request(p, "alice", 1, cache_salt="b")) == [0, 0]
    assert cached(False, Request(p, "alice", 1, cache_salt="a"), Request(p, "bob", 1, cache_salt="a")) == [0, 8]


@pytest.mark.parametrize("salt", ["", "x" * 257, "tab\there", 7])
def test_bad_cache_salt_is_a_400_not_a_crash(salt):
    """A salt is client input: a bad one is refused with its reason; the engine serves on."""
    engine = Engine(MODEL, TOK, EngineConfig(page_size=2, num_pages=32, context_len=96))
    bad = engine.submit(Request("abc\n", "alice", 1, cache_salt=salt))
    good = engine.submit(Request("abc\n", "alice", 1, cache_salt="ok"))
    answered = {r.request_id: r for r in engine.run()}
    assert answered[bad].status == 400 and "cache_salt" in answered[bad].error
    assert answered[good].status == 200


def test_audit_counts_cross_tenant_cache_hits_not_cross_reads():
    """Salt off: bob reuses alice's pages for the same tokens: a cache hit, not a leak."""
    engine = Engine(MODEL, TOK, EngineConfig(page_size=2, num_pages=64, context_len=96, cache_salt=False))
    engine.submit(Request("abcdefgh\n", "alice", 3))
    engine.run()
    engine.submit(Request("abcdefgx\n", "bob", 3))
    engine.run()
    assert engine.audit.cross_tenant_cache_hits == 1 and engine.audit.cache_hits == 1
    assert engine.audit.cross_tenant_reads == 0 and engine.audit.violations == 0


def test_audit_still_flags_a_read_of_tokens_the_reader_never_sent():
    """Same slots, same positions, different prompt: the audit calls it a cross read."""
    audit = OwnershipAudit(num_slots=8, page_size=2, node="n")
    audit.register(1, "a-1", "alice", [5, 6, 7, 8])
    audit.register(2, "b-1", "bob", [5, 9, 7, 8])  # differs at position 1
    audit.record_writes(torch.arange(4), torch.tensor([1, 1, 1, 1]), torch.arange(4))
    gather, valid = torch.arange(4)[None], torch.ones(1, 4, dtype=torch.bool)
    assert [e.victim for e in audit.check_reads(torch.tensor([2]), gather, valid)] == ["a-1"]
    assert audit.cross_tenant_reads == 1 and audit.cross_tenant_cache_hits == 0
    audit.register(3, "c-1", "carol", [5, 6, 7, 8, 1])  # the same tokens: a legitimate shared read
    assert audit.check_reads(torch.tensor([3]), gather, valid) == [] and audit.cross_tenant_cache_hits == 1
    audit.record_writes(torch.arange(4), torch.tensor([1, 1, 1, 1]), torch.tensor([1, 2, 3, 4]))  # shifted
    assert len(audit.check_reads(torch.tensor([3]), gather, valid)) == 1  # wrong positions: a cross read


# -- the fuzzer, with the prefill node's cache on (tests/test_fuzz.py holds the safe run) ---------------
def test_fuzzer_without_cache_salt_finds_cross_tenant_cache_hits():
    """The check can fail: with cache_salt off the fuzzer finds a tenant reusing another's cached pages."""
    target = next(t for t in targets() if t.name == "safe minus cache_salt")
    found = first_failing(MODEL, TOK, target, seed=0, limit=500)
    assert found is not None
    out = run_workload(MODEL, TOK, found[1], target.switches)
    assert out.cross_tenant_cache_hits > 0 and out.violations == 0
