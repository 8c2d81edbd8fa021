"""Every switch is declared once, and every door reads the same declaration (issue #32)."""

from dataclasses import fields

from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import PairSwitches, SafetySwitches
from minikv.engine.config import CacheSwitches, EngineConfig
from minikv.serve.backend import build_backend

CACHE = ("cache_salt", "cache_partition", "scrub_on_free")


def test_every_switch_is_declared_once():
    """The cache's three in CacheSwitches, the pair's in PairSwitches; no class below them declares one again."""
    assert tuple(f.name for f in fields(CacheSwitches)) == CACHE
    assert SafetySwitches.names() == [f.name for f in fields(PairSwitches)] + list(CACHE)
    for cls in (EngineConfig, SafetySwitches):
        assert not set(SafetySwitches.names()) & set(vars(cls).get("__annotations__", {})), cls.__name__


def test_the_safe_preset_partitions_and_no_door_does_by_default():
    """One default for the partition (off), shared by EngineConfig and SafetySwitches; the safe preset turns it on."""
    assert EngineConfig().cache_partition is SafetySwitches().cache_partition is False
    assert SafetySwitches.preset("safe") == SafetySwitches(cache_partition=True)


def test_the_served_engine_and_the_pair_read_every_cache_switch(tiny):
    """`minikv serve`'s single engine and the pair both scrub and partition when the switches say so."""
    switches = SafetySwitches.preset("safe").with_switches(enable=["scrub_on_free"])
    engine = build_backend(*tiny, switches, disagg=False, context_len=None, num_pages=64, tenants=2)
    pair = Cluster(*tiny, ClusterConfig(prefill_pages=128), switches)
    for pool in (engine.pool, pair.prefill_pool, pair.decode_pool):
        assert pool.scrub_on_free and pool.partition is not None and pool.partition.tenants == 2
