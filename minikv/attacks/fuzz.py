"""Random workloads for the disaggregated pair, the invariants they must keep, and the hunts for a broken
engine: `first_failing`, then `smallest_failing` to shrink it (docs/attacks.md, docs/disagg.md)."""

import random
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from unittest.mock import patch

import torch

from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import SafetySwitches
from minikv.disagg.transfer.inprocess import KVManager
from minikv.engine.request import Request
from minikv.model.llama import Llama, ModelConfig
from minikv.model.tokenizer import build_char_tokenizer

TENANTS = ("alice", "bob", "carol", "dave")


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
    """What one workload did, as the checks need it."""
    cross_tenant_reads: int
    cross_tenant_cache_hits: int  # a tenant reused cached pages another tenant's request wrote
    violations: int  # any read of a slot the reader did not write, never-written ones included
    leaked_pages: int  # pages still owned once the cluster is idle
    answers: Counter  # request id -> how many responses it got
    submitted: int
    misdelivered: int = 0  # responses handed to a tenant other than the one that submitted
    cancels: int = 0  # cancels that found the request live
    cancels_mid_transfer: int = 0  # ... of which with a KV write of that request on the wire
    unanswered: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """Every broken invariant, in words; empty when the workload was served correctly."""
        counts = [
            (self.cross_tenant_reads, "cross-tenant read(s)"),
            (self.violations - self.cross_tenant_reads, "read(s) of slots the reader did not write"),
            (self.cross_tenant_cache_hits, "cross-tenant prefix-cache hit(s)"),
            (self.leaked_pages, "page(s) still owned once idle"),
            (self.misdelivered, "response(s) delivered to the wrong tenant"),
            (len(self.unanswered), "request(s) never answered"),
            (sum(n > 1 for n in self.answers.values()), "request(s) answered more than once"),
        ]
        return [f"{n} {what}" for n, what in counts if n > 0]


def tiny_random_model() -> tuple[Llama, object]:
    """A 2-layer random Llama (seed 0) over the shipped character vocabulary: fast, enough for bookkeeping."""
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                      num_kv_heads=1, head_dim=8, max_position_embeddings=512)
    return Llama(cfg).eval(), tok


# -- the generator ----------------------------------------------------------------------------
def background_request(rng: random.Random, config: ClusterConfig) -> FuzzRequest:
    """Any arrival, any length up to past the window, sometimes cancelled at a random tick."""
    arrival = rng.randint(0, 20)
    cancel_at = arrival + rng.randint(0, 12) if rng.random() < 0.3 else None
    tenant, prompt_len = rng.choice(TENANTS), rng.randint(1, config.context_len + 8)
    return FuzzRequest(arrival, tenant, prompt_len, rng.randint(1, 6), cancel_at)


def cancel_and_follow(rng: random.Random, config: ClusterConfig) -> tuple[FuzzRequest, FuzzRequest]:
    """A long prompt cancelled while its first batch (posted a tick after arrival) is on the wire for
    `latency` ticks, and another tenant right after: its one-page prompt lands quickly in the freed
    pages, and it decodes a few tokens, reading them after the late batch lands."""
    ps, cap, max_tokens = config.page_size, config.transfer_batch_cap_pages, rng.randint(1, 4)
    window = min(config.context_len, config.decode_tokens)  # what a prompt and its output may hold
    longest = max(1, min(window - max_tokens, config.prefill_tokens - 1))
    prompt_len = rng.randint(min(longest, cap * ps), longest)  # a full batch if it fits
    batch = min(cap, -(-prompt_len // ps))
    latency = config.transfer_base_latency + -(-batch // config.transfer_pages_per_tick)
    arrival = rng.randint(0, 20)
    cancel_at = arrival + rng.randint(2, 1 + latency)
    victim, follower = rng.sample(TENANTS, 2)
    return (FuzzRequest(arrival, victim, prompt_len, max_tokens, cancel_at),
            FuzzRequest(cancel_at + rng.randint(0, 2), follower, rng.randint(1, ps), rng.randint(2, 8), None))


def random_workload(rng: random.Random) -> FuzzWorkload:
    """A cluster shape (often a slow fabric, a small decode pool), background requests, cancel-and-follows."""
    config = ClusterConfig(
        context_len=rng.randint(8, 96), page_size=rng.choice([2, 4, 8]),
        prefill_pages=rng.randint(1, 12), decode_pages=rng.randint(2, 24),
        transfer_base_latency=rng.randint(0, 6), transfer_pages_per_tick=rng.choice([1, 1, 1, 2, 3]),
        transfer_timeout_ticks=rng.randint(1, 16), transfer_batch_cap_pages=rng.randint(1, 8),
        event_log=False)
    requests = [background_request(rng, config) for _ in range(rng.randint(0, 6))]
    for _ in range(rng.randint(0, 3)):
        requests += cancel_and_follow(rng, config)
    if not requests:
        requests.append(background_request(rng, config))
    return FuzzWorkload(config, tuple(sorted(requests, key=lambda r: r.arrival)))


# -- playing a workload -------------------------------------------------------------------------
def run_workload(model: Llama, tok, workload: FuzzWorkload, switches: SafetySwitches,
                 max_ticks: int = 600) -> FuzzOutcome:
    """Play `workload` tick by tick through the front door and collect what the invariants are about."""
    cluster = Cluster(model, tok, workload.config, switches)
    answers: Counter = Counter()
    tenant_of: dict[str, str] = {}  # engine id -> tenant that submitted it
    ids: dict[int, str] = {}
    misdelivered = cancels = mid_transfer = 0
    last_arrival = max(r.arrival for r in workload.requests)
    for tick in range(max_ticks):
        for i, r in enumerate(workload.requests):
            if r.arrival == tick:
                ids[i] = cluster.submit(Request("x" * (r.prompt_len - 1) + "\n", r.tenant, r.max_tokens))
                tenant_of[ids[i]] = r.tenant
            if r.cancel_at == tick and i in ids:
                on_the_wire = cluster.kv_in_flight(ids[i])
                if cluster.cancel(ids[i]):
                    cancels, mid_transfer = cancels + 1, mid_transfer + on_the_wire
        for response in cluster.step():
            answers[response.request_id] += 1
            misdelivered += tenant_of.get(response.request_id) != response.tenant
        if tick > last_arrival and not cluster.has_work():
            break
    else:
        raise AssertionError(f"cluster still busy after {max_ticks} ticks")
    audits = [a for a in (cluster.prefill_audit, cluster.decode_audit) if a is not None]
    for pool in (cluster.prefill_pool, cluster.decode_pool):
        pool.check_integrity()  # no page both free and held, none lost, the cache index consistent
    return FuzzOutcome(
        cluster.cross_tenant_reads, cluster.cross_tenant_cache_hits, sum(a.violations for a in audits),
        cluster.leaked_pages(), answers, len(workload.requests), misdelivered, cancels, mid_transfer,
        unanswered=sorted(rid for rid in tenant_of if rid not in answers),
    )


def safe_for_fuzzing() -> SafetySwitches:
    """The safe preset without the startup refusal, so mismatched pools reach the runtime paths, and without
    the partition, whose quotas of a pool of a few pages would refuse most requests before they reach them."""
    return SafetySwitches.preset("safe").with_switches(disable=["startup_check", "cache_partition"])


# -- what the fuzzer must be able to find ---------------------------------------------------------
def settled_always_true() -> AbstractContextManager:
    """A code mutant: `KVManager.settled` says yes even with writes on the wire, while the block runs."""
    return patch.object(KVManager, "settled", lambda self, room: True)


@dataclass(frozen=True)
class Target:
    """A broken engine the fuzzer must find: switches, and optionally a code mutant applied meanwhile."""
    name: str
    switches: SafetySwitches
    mutant: Callable[[], AbstractContextManager] = nullcontext


def targets() -> tuple[Target, ...]:
    """The vulnerable preset, safe minus deferred release or cache_salt, and safe with `settled()` mutated."""
    return (
        Target("vulnerable preset", SafetySwitches.preset("vulnerable")),
        Target("safe minus deferred_release", safe_for_fuzzing().with_switches(disable=["deferred_release"])),
        Target("safe with settled() always true", safe_for_fuzzing(), settled_always_true),
        Target("safe minus cache_salt", safe_for_fuzzing().with_switches(disable=["cache_salt"])),
    )


def first_failing(model: Llama, tok, target: Target, seed: int,
                  limit: int) -> tuple[int, FuzzWorkload] | None:
    """The first of `limit` seeded workloads `target` serves wrongly, and its 1-based number; None if none."""
    rng = random.Random(seed)
    with target.mutant():
        for n in range(1, limit + 1):
            workload = random_workload(rng)
            if run_workload(model, tok, workload, target.switches).problems():
                return n, workload
    return None


def smallest_failing(model: Llama, tok, workload: FuzzWorkload, target: Target) -> FuzzWorkload:
    """Drop requests one at a time while `target` still serves the workload wrongly: a reproducer to read."""
    with target.mutant():
        requests = list(workload.requests)
        for r in list(requests):
            fewer = FuzzWorkload(workload.config, tuple(q for q in requests if q is not r))
            if fewer.requests and run_workload(model, tok, fewer, target.switches).problems():
                requests.remove(r)
    return FuzzWorkload(workload.config, tuple(requests))
