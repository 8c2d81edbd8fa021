"""The front door `minikv serve` builds from its flags, where the engine core runs (its process, or for
ServerThread the kernel's thread)."""

from dataclasses import replace

from transformers import PreTrainedTokenizerBase

from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.dist.cluster import DistCluster
from minikv.disagg.switches import SafetySwitches
from minikv.engine.config import EngineConfig, batch_for_pool
from minikv.engine.engine import Engine
from minikv.engine.front_door import FrontDoor
from minikv.engine.partition import quota_pages
from minikv.model.llama import Llama


def build_backend(model: Llama, tokenizer: PreTrainedTokenizerBase, switches: SafetySwitches, disagg: bool,
                  context_len: int | None, num_pages: int, transport: str = "inprocess",
                  model_dir: str | None = None, device: str | None = None, threads: int = 1, tenants: int = 1,
                  prefill_chunk: int | None = None, prefill_pages: int | None = None,
                  max_batch: int | None = None) -> FrontDoor:
    """The Engine, or the Cluster with its switches (in two worker processes with `transport="distributed"`).
    The event log is off (a server runs for days); the audit stays on. With `cache_partition` every pool is
    cut for `tenants` (one a key) and raised, if need be, until each tenant's quota holds a context window.
    The single engine runs `max_batch` requests at once, by default as many as its pool admits."""
    context = {"context_len": context_len} if context_len else {}
    context["cache_tenants"] = max(1, tenants)
    if prefill_chunk:  # on the single engine, or on the pair's prefill node
        context |= {"chunked_prefill": True, "max_prefill_tokens": prefill_chunk}
    if disagg:
        pools = {"prefill_pages": prefill_pages} if prefill_pages else {}  # by default ClusterConfig's
        pair = ClusterConfig(event_log=False, **context, **pools)
        if switches.cache_partition:
            pair = replace(pair, prefill_pages=quota(pair.prefill_pages, pair),
                           decode_pages=quota(pair.decode_pages, pair))
        if transport == "distributed":
            return DistCluster(tokenizer, pair, switches, model_dir=model_dir,
                               devices=(device, device) if device else None, threads=threads)
        return Cluster(model, tokenizer, pair, switches)
    config = EngineConfig(num_pages=num_pages, event_log=False, **context, cache_salt=switches.cache_salt,
                          cache_partition=switches.cache_partition, scrub_on_free=switches.scrub_on_free)
    if switches.cache_partition:
        config = replace(config, num_pages=quota(num_pages, config))
    batch = max_batch or batch_for_pool(config.num_pages * config.page_size)
    return Engine(model, tokenizer, replace(config, max_batch_size=batch))


def quota(pages: int, config: EngineConfig | ClusterConfig) -> int:
    """`pages`, raised if need be until each tenant's quota of them holds one context window."""
    return quota_pages(pages, config.context_len, config.page_size, config.cache_tenants)
