"""The prefix cache's eviction order is no side channel between tenants (prime and probe).

Per-tenant salts keep tenants' cache keys apart, but on one shared LRU of parked pages B can still
learn about A: B fills the pool with its own cached prompts (prime), A sends a prompt and then
either repeats it (a cache hit: no new pages) or sends a fresh one (a miss: new pages, evicting the
oldest parked ones), and B re-sends its prompts and reads its own `cached_tokens` (probe). With
`cache_partition` (the safe preset, as `minikv serve` builds its engine) A's requests never evict
B's pages, so what B reads is the same either way.
"""

from __future__ import annotations

import random

import pytest

from minikv.attacks.eviction import filler, prime_and_probe
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import SafetySwitches
from minikv.engine.request import Request
from minikv.serve.engine_loop import build_backend

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


def test_partitioned_pools_stay_whole_and_starve_nobody(tiny):
    """With more tenants than the cache is cut for, every request is still served and the pool stays
    consistent: a request takes others' parked pages only when nothing is held (nothing else would free one)."""
    door = build_backend(*tiny, SAFE, disagg=False, context_len=None, num_pages=96, tenants=2)
    rng = random.Random(1)
    ids = [door.submit(Request(filler(rng, 480), f"tenant-{i % 5}", 4)) for i in range(20)]
    done = {r.request_id: r for r in door.run()}
    assert all(done[i].status == 200 for i in ids)
    door.check_integrity()
    assert door.pool.num_free_pages == door.pool.num_pages
