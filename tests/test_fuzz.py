"""Fuzzing the disaggregated pair: safe means no invariant broken, and the fuzzer can fail."""

from __future__ import annotations

import random

import pytest

from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.attacks.fuzz import (
    first_failing, random_workload, run_workload, safe_for_fuzzing, settled_always_true, smallest_failing,
    targets, tiny_random_model,
)
from minikv.disagg.transfer.inprocess import KVManager
from minikv.engine.request import Request

MODEL, TOK = tiny_random_model()
SAFE_WORKLOADS = 500  # scripts/fuzz.py runs 2,000 and more
HUNT_LIMIT = 500  # workloads each broken engine must be found within (seed 0 finds each in under 60)


def test_safe_preset_keeps_every_invariant():
    """Random arrivals, over-length prompts, cancels mid-transfer and followers: no problem at all."""
    rng = random.Random(0)
    for n in range(1, SAFE_WORKLOADS + 1):
        workload = random_workload(rng)
        problems = run_workload(MODEL, TOK, workload, safe_for_fuzzing()).problems()
        assert problems == [], f"workload {n} of seed 0: {problems}\n{workload}"


def test_the_workloads_cancel_requests_while_their_kv_is_on_the_wire():
    """The generator reaches the late-write race: many cancels find a write of theirs in flight."""
    rng = random.Random(0)
    outcomes = [run_workload(MODEL, TOK, random_workload(rng), safe_for_fuzzing()) for _ in range(50)]
    assert sum(o.cancels_mid_transfer for o in outcomes) >= 20


@pytest.mark.parametrize("target", targets(), ids=lambda t: t.name)
def test_the_fuzzer_finds_each_broken_engine(target):
    """Vulnerable preset, safe minus deferred_release, the settled() mutant: each found, no shrinking counted."""
    assert first_failing(MODEL, TOK, target, seed=0, limit=HUNT_LIMIT) is not None


def test_a_found_workload_shrinks_to_a_cancel_and_a_follower():
    """Dropping requests while it still fails leaves the race: a cancelled request and another tenant's."""
    target = targets()[1]
    _, workload = first_failing(MODEL, TOK, target, seed=0, limit=HUNT_LIMIT)
    small = smallest_failing(MODEL, TOK, workload, target)
    assert run_workload(MODEL, TOK, small, target.switches).problems()
    assert len(small.requests) <= 3 and any(r.cancel_at is not None for r in small.requests)
    assert len({r.tenant for r in small.requests}) >= 2


def test_the_settled_mutant_is_undone_after_the_hunt():
    """The mutant patches KVManager.settled only while its block runs."""
    original = KVManager.settled
    with settled_always_true():
        assert KVManager.settled is not original
    assert KVManager.settled is original


def cancel_carol_mid_transfer_then_serve_dave(switches) -> Cluster:
    """Carol's 4-page batch is on the wire when she cancels; Dave arrives next and gets her pages."""
    config = ClusterConfig(context_len=64, page_size=2, prefill_pages=32, decode_pages=20, transfer_base_latency=2,
                           transfer_pages_per_tick=1, transfer_batch_cap_pages=8, event_log=False)
    cluster = Cluster(MODEL, TOK, config, switches)
    carol = cluster.submit(Request("x" * 30 + "\n", "carol", 4))
    for _ in range(3):
        cluster.step()
    assert cluster.kv_in_flight(carol) and cluster.cancel(carol)
    cluster.submit(Request("yy\n", "dave", 6))
    cluster.run()
    return cluster


def test_a_cancel_mid_transfer_leaks_without_deferred_release():
    """Batch cap on, deferred release off: Dave reads Carol's late write."""
    cluster = cancel_carol_mid_transfer_then_serve_dave(safe_for_fuzzing().with_switches(disable=["deferred_release"]))
    assert cluster.cross_tenant_reads > 0


def test_deferred_release_holds_a_cancelled_requests_pages_until_its_write_lands():
    """Same race, safe preset: Dave never reads a slot Carol wrote, and nothing stays owned."""
    cluster = cancel_carol_mid_transfer_then_serve_dave(safe_for_fuzzing())
    assert cluster.cross_tenant_reads == 0 and cluster.leaked_pages() == 0
