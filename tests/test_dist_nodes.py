"""Prefill and decode nodes in two real processes (gloo, loopback) answer as the in-process pair does."""

from __future__ import annotations

from http import HTTPStatus

import pytest

from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.dist_nodes import PairJob, node_pair_worker
from minikv.disagg.dist_pair import run_pair
from minikv.disagg.switches import SafetySwitches
from minikv.request import Request
from minikv.tokenizer import decode

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
    job = PairJob([(tenant, pair.check(Request(prompt, tenant, MAX_TOKENS))) for tenant, prompt in PROMPTS],
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
