"""The incident's numbers as configuration: the post-fix prefill pool, and what scrubbing leaves."""

from __future__ import annotations

import random

from minikv.disagg.cluster import POST_FIX_PREFILL_PAGES, ClusterConfig
from minikv.attacks.scenarios import BOB_PROMPT_CHARS, run_scenario
from minikv.disagg.switches import SafetySwitches
from minikv.attacks.workload import expected_reply, long_document_prompt

SECRET = "Zq 7-x,Lm 42"


def test_post_fix_prefill_pool_starts_under_startup_check_and_serves_bob_his_own_answer(tiny):
    """About 2.04 M / 1,024 tokens of prefill pool: the safe cluster starts, Bob's 800 tokens are read."""
    model, tok = tiny
    config = ClusterConfig(prefill_pages=POST_FIX_PREFILL_PAGES)
    assert 1_990 <= config.prefill_tokens <= 2_048
    r = run_scenario("over-length", model, tok, SafetySwitches.preset("safe"), secret=SECRET, config=config)
    assert r.refused is None and r.attacker.status == 200 and r.attacker.usage.prompt_tokens == BOB_PROMPT_CHARS
    bob_prompt = long_document_prompt("bob", BOB_PROMPT_CHARS, random.Random(0))  # the scenario's, seed 0
    assert r.attacker.text == expected_reply(bob_prompt) and r.cross_tenant_reads == 0


def test_a_scrubbed_page_counts_as_written_by_nobody(tiny):
    """With scrub_on_free, Bob reads zeros: no read of Alice's data, only of never-written memory."""
    model, tok = tiny
    r = run_scenario("over-length", model, tok, SafetySwitches.preset("vulnerable").with_switches(enable=["scrub_on_free"]),
                     secret=SECRET)
    audit = r.cluster.decode_audit
    assert r.attacker.status == 200 and audit.cross_tenant_reads == 0
    assert audit.violations > 0 and all(e.victim is None for e in audit.events)
