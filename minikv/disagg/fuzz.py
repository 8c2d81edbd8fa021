"""Random workloads for the disaggregated pair, and the invariants they must keep.

A workload is a cluster shape (pool sizes, transfer latency, timeout, batch cap) and a list of
requests with arrival ticks, prompt lengths (some past the prefill pool, some past the window),
output lengths and optional cancel ticks. `run_workload` plays it and reports what the checks
need: cross-tenant reads, cross-tenant prefix-cache hits, pages still held once idle, and how
often each request was answered. Every prompt is made of the same character, so prompts share
prefixes across tenants all the time and the prefill node's prefix cache is busy.
The model is a tiny random Llama: the invariants are about bookkeeping, not about words.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import SafetySwitches
from minikv.model import Llama, ModelConfig
from minikv.request import Request
from minikv.tokenizer import build_char_tokenizer


@dataclass(frozen=True)
class FuzzRequest:
    arrival: int
    tenant: str
    prompt_len: int
    max_tokens: int
    cancel_at: int | None


@dataclass(frozen=True)
class FuzzWorkload:
    config: ClusterConfig
    requests: tuple[FuzzRequest, ...]


@dataclass
class FuzzOutcome:
    cross_tenant_reads: int
    cross_tenant_cache_hits: int  # a tenant reused cached pages another tenant's request wrote
    violations: int  # any read of a slot the reader did not write, never-written ones included
    leaked_pages: int
    answers: Counter  # request id -> how many responses it got
    submitted: int


def tiny_random_model(seed: int = 0) -> tuple[Llama, object]:
    """A 2-layer random Llama over the shipped character vocabulary: fast, and enough for bookkeeping."""
    tok = build_char_tokenizer()
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                      num_kv_heads=1, head_dim=8, max_position_embeddings=512)
    return Llama(cfg).eval(), tok


@st.composite
def workloads(draw) -> FuzzWorkload:
    page = draw(st.sampled_from([2, 4, 8]))
    context = draw(st.integers(8, 96))
    config = ClusterConfig(
        context_len=context, page_size=page,
        prefill_pages=draw(st.integers(1, 12)), decode_pages=draw(st.integers(2, 24)),
        transfer_base_latency=draw(st.integers(0, 3)), transfer_pages_per_tick=draw(st.integers(1, 3)),
        transfer_timeout_ticks=draw(st.integers(1, 8)), transfer_batch_cap_pages=draw(st.integers(1, 4)),
        event_log=False,
    )
    n = draw(st.integers(1, 8))
    requests = tuple(
        FuzzRequest(
            arrival=draw(st.integers(0, 20)), tenant=draw(st.sampled_from(["alice", "bob", "carol", "dave"])),
            prompt_len=draw(st.integers(1, context + 8)), max_tokens=draw(st.integers(1, 6)),
            cancel_at=draw(st.none() | st.integers(0, 30)),
        )
        for _ in range(n)
    )
    return FuzzWorkload(config, requests)


def run_workload(model: Llama, tok, workload: FuzzWorkload, switches: SafetySwitches, max_ticks: int = 600) -> FuzzOutcome:
    """Play `workload` tick by tick and collect what the invariants are about."""
    cluster = Cluster(model, tok, workload.config, switches)
    answers: Counter = Counter()
    ids = {}
    for tick in range(max_ticks):
        for i, r in enumerate(workload.requests):
            if r.arrival == tick:
                prompt = "x" * (r.prompt_len - 1) + "\n"
                ids[i] = cluster.submit(Request(prompt, r.tenant, r.max_tokens, request_id=f"r{i}"))
            if r.cancel_at == tick and i in ids:
                cluster.cancel(ids[i])
        for response in cluster.step():
            answers[response.request_id] += 1
        if tick > max(r.arrival for r in workload.requests) and not cluster.has_work():
            break
    else:
        raise AssertionError(f"cluster still busy after {max_ticks} ticks")
    audits = [a for a in (cluster.prefill_audit, cluster.decode_audit) if a is not None]
    for pool in (cluster.prefill_pool, cluster.decode_pool):
        pool.check_integrity()  # no page both free and held, none lost, the cache index consistent
    return FuzzOutcome(cluster.cross_tenant_reads, cluster.cross_tenant_cache_hits, sum(a.violations for a in audits),
                       cluster.leaked_pages(), answers, len(workload.requests))


def safe_for_fuzzing() -> SafetySwitches:
    """The safe preset without the startup refusal, so mismatched pools reach the runtime paths."""
    return SafetySwitches.preset("safe").with_switches(disable=["startup_check"])
