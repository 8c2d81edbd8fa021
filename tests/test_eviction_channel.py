"""The prefix cache's eviction order is no side channel between tenants (prime and probe).

Per-tenant salts keep tenants' cache keys apart, but on one shared LRU of parked pages B can still
learn about A: B fills the pool with its own cached prompts (prime), A sends a prompt and then
either repeats it (a cache hit: no new pages) or sends a fresh one (a miss: new pages, evicting the
oldest parked ones), and B re-sends its prompts and reads its own `cached_tokens` (probe). With
`cache_partition` (the safe preset, as `minikv serve` builds its engine: a static partition, every
page counted against one tenant's quota) neither A's requests nor B's own keyless decodes, holding
pages off a free stack A's pages shrink (the held-pages variant), change what B reads.
"""

from __future__ import annotations

import random

import pytest

from minikv.attacks.eviction import filler, held_pages, prime_and_probe
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import SafetySwitches
from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.engine.request import Request
from minikv.serve.backend import build_backend

SAFE = SafetySwitches.preset("safe")
WITHOUT_PARTITION = SAFE.with_switches(disable=["cache_partition"])


def single(tiny, switches: SafetySwitches):
    """The single-node engine as `minikv serve` builds it for two keys: 256 pages of 16 tokens."""
    return lambda: build_backend(*tiny, switches, disagg=False, context_len=None, num_pages=256, tenants=2)


def pair(tiny, switches: SafetySwitches):
    """The disaggregated pair, its prefill pool (the one with a cache) as large as the engine's."""
    config = ClusterConfig(prefill_pages=256, decode_pages=256, cache_tenants=2, event_log=False)
    return lambda: Cluster(*tiny, config, switches)


@pytest.mark.parametrize("build", [single, pair], ids=["single", "disagg"])
def test_b_reads_the_same_whether_a_repeated_or_not(tiny, build):
    """Partitioned by tenant, B's readings do not depend on whether A's second prompt hit A's cache."""
    make = build(tiny, SAFE)
    assert prime_and_probe(make(), a_repeats=True) == prime_and_probe(make(), a_repeats=False)


@pytest.mark.parametrize("build", [single, pair], ids=["single", "disagg"])
def test_a_shared_lru_tells_b_whether_a_repeated(tiny, build):
    """The channel the partition closes: on one LRU, A's miss evicts B's oldest pages and B sees it."""
    make = build(tiny, WITHOUT_PARTITION)
    repeated, fresh = prime_and_probe(make(), a_repeats=True), prime_and_probe(make(), a_repeats=False)
    assert repeated != fresh and sum(fresh) < sum(repeated)


def small_single(tiny, switches: SafetySwitches):
    """The engine as `minikv serve --max-batch 64` builds it for two keys, small: 64 pages of 16 tokens, a
    256-token window. The holds must run at once: serve's default limit at this pool, 16, would queue them."""
    return lambda: build_backend(*tiny, switches, disagg=False, context_len=256, num_pages=64, tenants=2,
                                 max_batch=64)


def small_pair(tiny, switches: SafetySwitches):
    """The pair, its prefill pool (the one with a cache) as small as that engine's; decode room for the holds."""
    config = ClusterConfig(context_len=256, prefill_pages=64, decode_pages=128, cache_tenants=2, event_log=False)
    return lambda: Cluster(*tiny, config, switches)


HOLDS = {"b_prompts": 3, "chars": 112, "holds": 44, "hold_tokens": 15}  # Bob's share primed, then 44 pages held


@pytest.mark.parametrize("build", [small_single, small_pair], ids=["single", "disagg"])
def test_held_pages_tell_b_nothing_under_the_partition(tiny, build):
    """Bob's pages held by keyless decodes count against his quota alone: what survives is the same either way."""
    make = build(tiny, SAFE)
    assert held_pages(make(), a_repeats=True, **HOLDS) == held_pages(make(), a_repeats=False, **HOLDS)


@pytest.mark.parametrize("build", [small_single, small_pair], ids=["single", "disagg"])
def test_held_pages_on_a_shared_pool_tell_b_whether_a_repeated(tiny, build):
    """The channel the quota closes: on a shared stack Bob's holds evict more of his pages after Alice's miss."""
    make = build(tiny, WITHOUT_PARTITION)
    repeated, fresh = held_pages(make(), a_repeats=True, **HOLDS), held_pages(make(), a_repeats=False, **HOLDS)
    assert repeated != fresh and sum(fresh) < sum(repeated)


def test_a_tenant_beyond_the_partition_is_refused_in_one_line(tiny):
    """A partition cut for two tenants serves the first two that appear and refuses a third with a 400 of one
    line; the pool stays consistent, each tenant within its quota."""
    door = build_backend(*tiny, SAFE, disagg=False, context_len=None, num_pages=128, tenants=2)
    rng = random.Random(1)
    ids = [door.submit(Request(filler(rng, 480), f"tenant-{i % 3}", 4)) for i in range(6)]
    done = {r.request_id: r for r in door.run()}
    assert [done[i].status for i in ids] == [200, 200, 400] * 2
    assert "\n" not in done[ids[2]].error and "partitioned for 2 tenant(s)" in done[ids[2]].error
    door.check_integrity()
    assert max(door.pool.partition.pages_of.values()) <= door.pool.partition.quota == 64


def test_a_request_past_its_tenants_quota_is_refused_at_the_door(tiny):
    """A request that fits the pool but not its tenant's quota can never run: 400 at intake, not a wait forever
    (`minikv serve` sizes its pools so that a quota holds the window; an Engine built by hand need not)."""
    door = Engine(*tiny, EngineConfig(num_pages=96, cache_partition=True, cache_tenants=2))
    [response] = door.generate([filler(random.Random(2), 1000)], max_tokens=20, tenant="bob")
    assert response.status == 400 and "its quota" in response.error


def test_serve_sizes_its_batch_limit_to_the_pool(tiny):
    """minikv serve runs as many requests at once as its pool admits at 64 tokens each, or --max-batch."""
    sized = build_backend(*tiny, WITHOUT_PARTITION, disagg=False, context_len=None, num_pages=64)
    given = build_backend(*tiny, WITHOUT_PARTITION, disagg=False, context_len=None, num_pages=64, max_batch=3)
    assert (sized.scheduler.max_batch_size, given.scheduler.max_batch_size) == (64 * 16 // 64, 3)
