"""Checkers for notebook 10 (what the salt leaves open): the pages Bob's holds evict, against the page pool's
own allocator (shared, or cut by the static partition); the ROC AUC of two samples, against scipy's
Mann-Whitney U."""

import random
from collections.abc import Callable

from scipy.stats import mannwhitneyu

from minikv.engine.page_pool import PagePool
from minikv.engine.prefix_cache import page_keys
from minikv.exercises import TINY_MODEL, expect_cases


def _park(pool: PagePool, tenant: str, pages: int) -> list[int]:
    """`tenant` sends a prompt of `pages` full 1-token pages; they stay cached and parked when it ends."""
    held = pool.allocate(pages, tenant, tenant=tenant)
    if pool.prefix_cache is not None:
        pool.prefix_cache.cache_pages(page_keys(list(range(pages)), 1, salt=tenant), held, pages)
    pool.free(held, tenant, tenant=tenant)
    return held


def bob_evicted(num_pages: int, tenants: int, bob_parked: int, alice_parked: int, holds: int,
                partitioned: bool) -> int:
    """What the pool does: Bob parks his pages, then Alice hers, then Bob holds `holds` new pages."""
    pool = PagePool(TINY_MODEL, num_pages, 1, prefix_caching=True,
                    partition_tenants=tenants if partitioned else None)
    mine = _park(pool, "bob", bob_parked)
    _park(pool, "alice", alice_parked)
    pool.allocate(holds, "bob-holds", tenant="bob")
    return sum(not pool.prefix_cache.is_cached(p) for p in mine)


def check_bob_evicted(fn: Callable[[int, int, int, int, int, bool], int]) -> None:
    """fn(num_pages, tenants, bob_parked, alice_parked, holds, partitioned) -> how many of Bob's parked pages
    his `holds` new pages evict, when Bob parked his pages first and Alice parked hers after."""
    rng = random.Random(10)
    cases = [(64, 2, 21, 7, 44, False), (64, 2, 21, 13, 44, False), (64, 2, 21, 7, 20, True),
             (64, 2, 21, 13, 20, True), (32, 4, 4, 8, 2, True)]
    while len(cases) < 40:
        num_pages, tenants, partitioned = rng.choice([16, 24, 32, 64]), rng.choice([2, 4]), rng.random() < 0.5
        room = num_pages // tenants if partitioned else num_pages
        bob = rng.randint(0, room)
        alice = rng.randint(0, room if partitioned else num_pages - bob)
        cases.append((num_pages, tenants, bob, alice, rng.randint(0, room), partitioned))
    expect_cases(fn, bob_evicted, cases, "pool of {} pages cut for {} tenants, Bob parked {}, "
                 "Alice {}, Bob holds {}, partitioned {}: Bob's pages evicted",
                 "Shared: new pages come off the free stack first, then the oldest parked pages, and Bob's "
                 "are the oldest. Partitioned: off the stack while Bob is under his quota "
                 "(num_pages // tenants), then his own.", "correct on {} pools")


def auc(miss: list[float], hit: list[float]) -> float:
    """Scipy's Mann-Whitney U of the misses over the hits, over the number of pairs."""
    return float(mannwhitneyu(miss, hit).statistic) / (len(miss) * len(hit))


def check_auc(fn: Callable[[list[float], list[float]], float]) -> None:
    """fn(miss, hit) -> the chance that a random miss's measure is larger than a random hit's, a tie half."""
    rng = random.Random(4)
    cases = [([3.0], [1.0]), ([1.0], [3.0]), ([2.0], [2.0]), ([5.0, 1.0], [2.0, 2.0, 9.0])]
    for _ in range(30):
        grid = rng.choice([3, 10, 1000])  # few values: many ties; many values: almost none
        miss = [float(rng.randrange(grid) + rng.randrange(2)) for _ in range(rng.randint(1, 8))]
        hit = [float(rng.randrange(grid)) for _ in range(rng.randint(1, 8))]
        cases.append((miss, hit))
    expect_cases(fn, auc, cases, "misses {}, hits {}", "Count the (miss, hit) pairs in which the "
                 "miss is larger, a tie as half a pair, and divide by the number of pairs.",
                 "correct on {} pairs of samples")
