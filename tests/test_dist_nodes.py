"""Prefill and decode nodes in two real processes (gloo, loopback) answer as the in-process pair does."""

from __future__ import annotations

import random
from http import HTTPStatus

import pytest

from minikv.attacks.scenarios import BOB_PROMPT_CHARS, run_scenario
from minikv.attacks.scenarios import MAX_TOKENS as SCENARIO_MAX_TOKENS
from minikv.attacks.workload import Note, long_document_prompt, note_prompt
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.dist.cluster import DistCluster
from minikv.disagg.switches import SafetySwitches
from minikv.engine.request import Request

CONFIG = ClusterConfig(prefill_pages=64, decode_pages=128, cache_tenants=3)  # PROMPTS' three tenants
MAX_TOKENS = 8
PROMPTS = [(f"tenant-{i % 3}", f"Request {i}: " + "the quick brown fox jumps over the lazy dog. " * (1 + i % 4))
           for i in range(20)]


def drained(cluster: DistCluster) -> dict:
    """The workers' last reports, once neither holds a page."""
    for _ in range(2_000):
        cluster.health()
        if not cluster.leaked_pages():
            break
    return cluster.reports


@pytest.fixture(scope="module")
def both(tiny):
    """The same 20 greedy requests through the in-process Cluster and through two processes."""
    model, tok = tiny
    answers = []
    safe = SafetySwitches.preset("safe")
    for door in (Cluster(model, tok, CONFIG, safe), DistCluster(tok, CONFIG, safe)):
        try:
            ids = [door.submit(Request(prompt, tenant, MAX_TOKENS)) for tenant, prompt in PROMPTS]
            done = {r.request_id: r for r in door.run(max_steps=20_000)}
            answers.append([done[i] for i in ids])
            reports = drained(door) if isinstance(door, DistCluster) else None
        finally:
            door.close()
    return answers[0], answers[1], reports


def test_greedy_outputs_match_the_in_process_backend(both):
    """Every one of 20 requests gets the same status and text across processes as in one process."""
    in_process, distributed, _ = both
    assert len(distributed) == len(PROMPTS)
    for one, two in zip(in_process, distributed):
        assert one.status == two.status == HTTPStatus.OK and one.text == two.text, one.request_id


def test_pools_whole_and_no_foreign_reads_after_draining(both):
    """Both processes end holding no page, with no cross-tenant read in either audit."""
    reports = both[2]
    assert [r["pages_held"] for r in reports.values()] == [0, 0]
    assert [r["cross_tenant_reads"] for r in reports.values()] == [0, 0]


SECRET = "5412 7534 9821 0064"
VULNERABLE = SafetySwitches.preset("vulnerable")


def over_length_across_processes(tiny, switches: SafetySwitches):
    """The incident's over-length scenario in one process (reference) and in two: (bob's answers, decode's report)."""
    model, tok = tiny
    reference = run_scenario("over-length", model, tok, switches, secret=SECRET, seed=0)
    cluster = DistCluster(tok, ClusterConfig(), switches)
    try:
        cluster.submit(Request(note_prompt("alice", Note("card", SECRET)), "alice", SCENARIO_MAX_TOKENS))
        cluster.run(max_steps=20_000)
        cluster.submit(Request(long_document_prompt("bob", BOB_PROMPT_CHARS, random.Random(0)), "bob", SCENARIO_MAX_TOKENS))
        [bob] = cluster.run(max_steps=20_000)
        return reference.attacker, bob, drained(cluster)[1]
    finally:
        cluster.close()


def test_vulnerable_over_length_leaks_across_the_process_boundary(tiny):
    """With the vulnerable preset Bob's answer holds Alice's secret, as in one process, and the decode audit sees it."""
    reference, bob, decode_side = over_length_across_processes(tiny, VULNERABLE)
    assert bob.status == HTTPStatus.OK and SECRET in bob.text and bob.text == reference.text
    assert decode_side["cross_tenant_reads"] > 0


@pytest.mark.parametrize("switch", ["reject_check", "kv_checksum", "kv_canary"])
def test_each_switch_closes_the_leak_across_processes(tiny, switch):
    """One switch on over the vulnerable preset: Bob gets an error, not Alice's secret, as in one process."""
    reference, bob, decode_side = over_length_across_processes(tiny, VULNERABLE.with_switches(enable=[switch]))
    assert bob.status != HTTPStatus.OK and bob.status == reference.status
    assert decode_side["cross_tenant_reads"] == 0
