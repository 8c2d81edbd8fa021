"""Prefill and decode nodes in two real processes (gloo, loopback) answer as the in-process pair does."""

from __future__ import annotations

import random
from http import HTTPStatus

import pytest

from minikv.admission import check_request
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.dist_nodes import PairJob, node_pair_worker
from minikv.disagg.dist_pair import run_pair
from minikv.disagg.scenarios import BOB_PROMPT_CHARS, run_scenario
from minikv.disagg.scenarios import MAX_TOKENS as SCENARIO_MAX_TOKENS
from minikv.disagg.switches import SafetySwitches
from minikv.request import Request
from minikv.tokenizer import decode
from minikv.workload import Note, long_document_prompt, note_prompt

CONFIG = ClusterConfig(prefill_pages=64, decode_pages=128)
MAX_TOKENS = 8
PROMPTS = [(f"tenant-{i % 3}", f"Request {i}: " + "the quick brown fox jumps over the lazy dog. " * (1 + i % 4))
           for i in range(20)]


@pytest.fixture(scope="module")
def both(tiny):
    """The same 20 greedy requests through the in-process Cluster and through two processes."""
    model, tok = tiny
    pair = Cluster(model, tok, CONFIG, SafetySwitches())
    for tenant, prompt in PROMPTS:
        pair.submit(Request(prompt, tenant, MAX_TOKENS))
    in_process = {r.request_id: r for r in pair.run()}
    job = PairJob([[(tenant, pair.check(Request(prompt, tenant, MAX_TOKENS))) for tenant, prompt in PROMPTS]],
                  MAX_TOKENS, CONFIG, SafetySwitches())
    prefill, decode_side = run_pair(node_pair_worker, job, timeout_s=28)
    return tok, [in_process[rid] for rid in sorted(in_process, key=lambda r: int(r.split("-")[-1]))], prefill, decode_side


def test_greedy_outputs_match_the_in_process_backend(both):
    """Every one of 20 requests gets the same status and text across processes as in one process."""
    tok, in_process, _, decode_side = both
    answers = decode_side["answers"]
    assert len(answers) == len(PROMPTS) == len(in_process)
    for i, response in enumerate(in_process, start=1):
        status, ids = answers[f"req-{i}"]
        assert response.status == HTTPStatus.OK and status == HTTPStatus.OK
        assert decode(tok, [t for t in ids if t != tok.eos_token_id]) == response.text, f"req-{i}"


def test_pools_whole_and_no_foreign_reads_after_draining(both):
    """Both processes end holding no page, with no cross-tenant read in either audit."""
    _, _, prefill, decode_side = both
    assert prefill["pages_held"] == 0 and decode_side["pages_held"] == 0
    assert prefill["cross_tenant_reads"] == 0 and decode_side["cross_tenant_reads"] == 0


SECRET = "5412 7534 9821 0064"
VULNERABLE = SafetySwitches.preset("vulnerable")


def over_length_across_processes(tiny, switches: SafetySwitches) -> tuple[object, dict]:
    """The incident's over-length scenario, in one process (reference) and in two: (bob in-process, decode side)."""
    model, tok = tiny
    reference = run_scenario("over-length", model, tok, switches, secret=SECRET, seed=0)
    alice = note_prompt("alice", Note("card", SECRET))
    bob = long_document_prompt("bob", BOB_PROMPT_CHARS, random.Random(0))
    ids = lambda text, tenant: check_request(Request(text, tenant, SCENARIO_MAX_TOKENS), tok)
    job = PairJob([[("alice", ids(alice, "alice"))], [("bob", ids(bob, "bob"))]], SCENARIO_MAX_TOKENS,
                  ClusterConfig(), switches)
    _, decode_side = run_pair(node_pair_worker, job, timeout_s=28)
    return reference.attacker, decode_side


def test_vulnerable_over_length_leaks_across_the_process_boundary(tiny):
    """With the vulnerable preset Bob's answer holds Alice's secret, as in one process, and the decode audit sees it."""
    _, tok = tiny
    reference, decode_side = over_length_across_processes(tiny, VULNERABLE)
    status, ids = decode_side["answers"]["req-2"]
    text = decode(tok, [t for t in ids if t != tok.eos_token_id])
    assert status == HTTPStatus.OK and SECRET in text and text == reference.text
    assert decode_side["cross_tenant_reads"] > 0


@pytest.mark.parametrize("switch", ["reject_check", "kv_checksum", "kv_canary"])
def test_each_switch_closes_the_leak_across_processes(tiny, switch):
    """One switch on over the vulnerable preset: Bob gets an error, not Alice's secret, as in one process."""
    reference, decode_side = over_length_across_processes(tiny, VULNERABLE.with_switches(enable=[switch]))
    status, _ = decode_side["answers"]["req-2"]
    assert status != HTTPStatus.OK and status == reference.status
    assert decode_side["cross_tenant_reads"] == 0
