"""Which decode-side check catches which over-length leak: the canary sees pages, the checksum counts tokens."""

from __future__ import annotations

import pytest

from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.attacks.fuzz import tiny_random_model
from minikv.disagg.switches import SafetySwitches
from minikv.engine.request import Request

MODEL, TOK = tiny_random_model()
PAGE = 8  # one prefill page: the longest accepted prompt is 7 tokens


def over_length_after_alice(switch: str, bob_prompt_len: int) -> tuple[Cluster, int, str | None]:
    """Vulnerable pair plus one check, a one-page prefill pool: Alice fills the page, then Bob's
    over-length prompt is swapped for a 1-token placeholder whose page is sent whole."""
    config = ClusterConfig(context_len=64, page_size=PAGE, prefill_pages=1, decode_pages=16, event_log=False)
    cluster = Cluster(MODEL, TOK, config, SafetySwitches.preset("vulnerable").with_switches(enable=[switch]))
    cluster.submit(Request("a" * (PAGE - 2) + "\n", "alice", 2))  # 7 tokens: slots 0-6 of the prefill page
    cluster.run()
    bob = cluster.submit(Request("b" * (bob_prompt_len - 1) + "\n", "bob", 4))
    reply = {r.request_id: r for r in cluster.run()}[bob]
    return cluster, reply.status, reply.error


def test_kv_canary_misses_an_over_length_prompt_that_fits_in_the_one_page_sent():
    """8 tokens, one page: the page arrives whole, no poison is left, and Bob reads Alice's slots."""
    cluster, status, _ = over_length_after_alice("kv_canary", PAGE)
    assert status == 200 and cluster.cross_tenant_reads > 0


def test_kv_canary_catches_an_over_length_prompt_past_the_page_sent():
    """12 tokens, two pages: the second never arrives and still holds the poison."""
    cluster, status, error = over_length_after_alice("kv_canary", PAGE + 4)
    assert status == 500 and "canary intact in 1 of 2 prompt pages" in error
    assert cluster.cross_tenant_reads == 0


@pytest.mark.parametrize("bob_prompt_len", [PAGE, PAGE + 4])
def test_kv_checksum_catches_both_by_the_token_count(bob_prompt_len):
    """Prefill sent KV for 1 token where the prompt has 8 or 12: refused before any read."""
    cluster, status, error = over_length_after_alice("kv_checksum", bob_prompt_len)
    assert status == 500 and f"sent KV for 1 token(s), the prompt has {bob_prompt_len}" in error
    assert cluster.cross_tenant_reads == 0
