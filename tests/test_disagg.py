"""Disaggregated prefill/decode: the leak reproduced end to end, and each switch against it."""

from __future__ import annotations

import random
import re
import zlib

import pytest
import torch

from minikv.engine.config import EngineConfig
from minikv.disagg.checksum import adler32_from_definition, gathered_kv, kv_checksum
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.attacks.scenarios import BOB_PROMPT_CHARS, run_scenario
from minikv.disagg.switches import SafetySwitches
from minikv.disagg.transfer.base import KVPoll
from minikv.engine.engine import Engine
from minikv.engine.events import EventLog
from minikv.engine.request import Request
from minikv.attacks.workload import long_document_prompt

VULNERABLE = SafetySwitches.preset("vulnerable")
SAFE = SafetySwitches.preset("safe")
SECRET = "Zq 7-x,Lm 42"


def play(tiny, scenario, switches, secret=SECRET, **kw):
    model, tok = tiny
    return run_scenario(scenario, model, tok, switches, secret=secret, **kw)


def test_adler32_from_definition_on_known_values():
    """The byte-at-a-time reference gives RFC 1950's published values ('Wikipedia' is 0x11E60398)."""
    assert adler32_from_definition(b"") == 1
    assert adler32_from_definition(b"Wikipedia") == 0x11E60398


def test_zlib_matches_the_definition():
    """zlib's Adler-32 (what kv_checksum runs) equals the byte-at-a-time definition on random bytes."""
    g = torch.Generator().manual_seed(0)
    for n in (0, 1, 7, 5552, 5553, 70_000):
        data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).numpy().tobytes()
        assert zlib.adler32(data) == adler32_from_definition(data), n


def test_kv_checksum_covers_exactly_the_requests_tokens(tiny):
    """kv_checksum is the definition's Adler-32 of the request's slots, partial last page and scattered
    pages included; changing one byte of one token changes it, a byte past its last token does not."""
    from minikv.engine.page_pool import PagePool

    model, _ = tiny
    pool = PagePool(model.config, num_pages=12, page_size=4)
    pool.kv.normal_(generator=torch.Generator().manual_seed(0))
    rng = random.Random(0)
    for num_tokens in (1, 3, 4, 5, 17, 48):
        table = rng.sample(range(12), pool.pages_for(num_tokens))
        k, v = gathered_kv(pool, table, num_tokens)
        by_definition = adler32_from_definition(k.numpy().tobytes()) ^ adler32_from_definition(v.numpy().tobytes())
        assert kv_checksum(pool, table, num_tokens) == by_definition
    table = [7, 2, 9]
    before = kv_checksum(pool, table, 10)
    pool.kv[3, 1, 9, 1, 0, 0] += 1.0  # layer 3, V, page 9 row 1: token 9, inside the request
    after = kv_checksum(pool, table, 10)
    assert after != before
    pool.kv[3, 1, 9, 2, 0, 0] += 1.0  # row 2 of the last page: token 10, outside it
    assert kv_checksum(pool, table, 10) == after


@pytest.mark.parametrize("secret", [SECRET, "4111 2222 3333 4444", "K"])
def test_vulnerable_over_length_leaks_the_victims_secret(tiny, secret):
    """Bob gets HTTP 200, prompt_tokens of his long prompt, and Alice's secret in his reply."""
    r = play(tiny, "over-length", VULNERABLE, secret)
    bob = r.attacker
    assert r.victim.status == 200 and secret in r.victim.text
    assert bob.status == 200 and bob.error is None
    assert bob.usage.prompt_tokens == BOB_PROMPT_CHARS
    assert secret in bob.text
    assert r.cross_tenant_reads > 0 and r.audit_pages()


def prefill_tokens(log: EventLog, request_id: str) -> int:
    """Prompt tokens whose K/V a prefill computed for the request, counted in the event log's writes."""
    return sum(int(m.group(1)) for e in log.of_kind("write")
               if e.request_id == request_id and (m := re.match(r"prefill: (\d+) token", e.detail or "")))


def test_leaked_reply_skips_the_prefill_its_prompt_needs(tiny):
    """Bob's reply comes back sooner than his prompt allows: the pair computed K/V for almost none of his
    800 prompt tokens, where a single node computes every one (counted in the event logs, not timed)."""
    model, tok = tiny
    bob = play(tiny, "over-length", VULNERABLE)
    engine = Engine(model, tok, EngineConfig(num_pages=128, context_len=1024))
    prompt = long_document_prompt("bob", BOB_PROMPT_CHARS, random.Random(0))  # the scenario's own
    single = engine.generate([prompt], max_tokens=1)[0]
    assert single.status == 200 and single.usage.prompt_tokens == BOB_PROMPT_CHARS
    assert bob.attacker.usage.prompt_tokens == BOB_PROMPT_CHARS
    assert prefill_tokens(engine.log, single.request_id) == BOB_PROMPT_CHARS
    assert 0 < prefill_tokens(bob.cluster.log, bob.attacker.request_id) < BOB_PROMPT_CHARS // 10


def test_safe_preset_refuses_the_mismatched_cluster(tiny):
    """With every switch on, the incident's configuration does not even start."""
    r = play(tiny, "over-length", SAFE)
    assert r.refused and "1024 tokens exceeds the prefill node's KV pool of 672 tokens" in r.refused


def test_safe_preset_on_a_started_cluster_answers_400_and_leaks_nothing(tiny):
    """Safe preset (minus the startup refusal): Bob gets 400 with a reason (his quota: half of 42 pages, less one
    token), audit stays 0."""
    r = play(tiny, "over-length", SAFE.with_switches(disable=["startup_check"]))
    assert r.attacker.status == 400 and "exceeds the maximum of 335" in r.attacker.error
    assert SECRET not in r.attacker.text and r.cross_tenant_reads == 0
    assert r.cluster.leaked_pages() == 0


@pytest.mark.parametrize("switch, status", [("reject_check", 400), ("kv_checksum", 500), ("kv_canary", 500)])
def test_each_detection_switch_alone_stops_the_over_length_leak(tiny, switch, status):
    """On top of the vulnerable preset, one switch is enough to keep Alice's secret from Bob."""
    r = play(tiny, "over-length", VULNERABLE.with_switches(enable=[switch]))
    assert r.attacker.status == status and r.attacker.error
    assert SECRET not in r.attacker.text
    assert r.cluster.decode_audit.cross_tenant_reads == 0


def test_startup_check_alone_refuses_then_the_advised_context_gives_400(tiny):
    """startup_check refuses to start; with context lowered as advised, Bob gets 400."""
    r = play(tiny, "over-length", VULNERABLE.with_switches(enable=["startup_check"]))
    assert r.refused and "lower context_len to at most 672" in r.refused
    r = play(tiny, "over-length", VULNERABLE.with_switches(enable=["startup_check"]), config=ClusterConfig(context_len=672))
    assert r.attacker.status == 400 and "context window is 672" in r.attacker.error


def test_scrub_on_free_hides_the_secret_but_still_answers_200(tiny):
    """Zeroing freed pages removes Alice's words, not the bug: Bob still gets a 200."""
    r = play(tiny, "over-length", VULNERABLE.with_switches(enable=["scrub_on_free"]))
    assert r.attacker.status == 200 and SECRET not in r.attacker.text
    assert r.attacker.usage.prompt_tokens == BOB_PROMPT_CHARS


def test_vulnerable_late_write_leaks_into_the_next_tenant(tiny):
    """Carol's transfer times out (500); her late batch lands in Dave's pages; Dave reads it."""
    r = play(tiny, "late-write", VULNERABLE)
    assert r.victim.status == 500 and "timed out" in r.victim.error
    assert r.attacker.status == 200 and SECRET in r.attacker.text
    assert r.cross_tenant_reads > 0


@pytest.mark.parametrize("switch", ["deferred_release", "transfer_batch_cap"])
def test_each_transfer_switch_alone_stops_the_late_write_leak(tiny, switch):
    """Deferred release or a transfer batch cap, alone, keeps Carol's KV out of Dave's reply."""
    r = play(tiny, "late-write", VULNERABLE.with_switches(enable=[switch]))
    assert r.attacker.status == 200 and SECRET not in r.attacker.text
    assert r.cross_tenant_reads == 0


def test_ordinary_requests_are_served_identically_by_the_pair_and_a_single_node(tiny):
    """Disaggregation changes where the work runs, not the words."""
    model, tok = tiny
    prompts = ["alice: save pin 0912.\n", "bob: save card 4111 2222 3333 4444.\n", "carol: read the report. save memo hi.\n"]
    for switches in (VULNERABLE, SAFE):
        pair = Cluster(model, tok, ClusterConfig(prefill_pages=64, decode_pages=128), switches)
        single = Engine(model, tok, EngineConfig(num_pages=64))
        got, want = pair.generate(prompts, 40), single.generate(prompts, 40)
        assert [r.text for r in got] == [r.text for r in want]
        assert all(r.status == 200 for r in got) and pair.cross_tenant_reads == 0 and pair.leaked_pages() == 0


def test_transfer_poll_states_follow_sglang(tiny):
    """A receiver goes Bootstrapping -> WaitingForInput -> Transferring -> Success."""
    model, tok = tiny
    pair = Cluster(model, tok, ClusterConfig(prefill_pages=64, decode_pages=128), SAFE)
    rid = pair.submit(Request("alice: save pin 0912.\n", "alice", 8))
    receiver = next(iter(pair.decode.endpoints.values()))
    seen, done = [receiver.poll()], []
    while rid not in [r.request_id for r in done]:
        done += pair.step()
        seen.append(receiver.poll())
    order = list(dict.fromkeys(seen))
    assert order == [KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success]


@pytest.mark.parametrize("bad", [
    dict(prefill_pages=0), dict(page_size=-1), dict(decode_pages=-5), dict(context_len=0),
])
def test_bad_cluster_sizes_are_refused_with_the_numbers(bad):
    """Negative or zero sizes fail at construction with a message naming the field."""
    with pytest.raises(ValueError, match=next(iter(bad))):
        ClusterConfig(**bad)


def test_unknown_preset_and_switch_are_clear_errors():
    with pytest.raises(ValueError, match="unknown preset"):
        SafetySwitches.preset("paranoid")
    with pytest.raises(ValueError, match="unknown switch 'kv_crc'"):
        SAFE.with_switches(enable=["kv_crc"])
