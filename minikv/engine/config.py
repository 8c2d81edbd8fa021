"""Engine configuration, validated when built: a bad value fails here with the numbers involved."""

from dataclasses import dataclass

from minikv.model.llama import ModelConfig

ADMITTED_REQUEST_TOKENS = 64  # a request's typical size when admitted: the benchmark's median prompt is 50


def batch_for_pool(pool_tokens: int) -> int:
    """serve's default batch limit: as many requests as the pool admits at a typical prompt, 64 for its
    default 256 pages of 16 (measured best there, docs/benchmarks.md); past that, more only preempts more."""
    return max(1, pool_tokens // ADMITTED_REQUEST_TOKENS)


@dataclass(frozen=True)
class CacheSwitches:
    """The mitigations that act inside a node's pool, each declared here once: EngineConfig carries them
    for one engine, SafetySwitches (disagg/switches.py) for the pair, after the pair's own."""

    cache_salt: bool = True  # salt every request's page keys with its tenant: no sharing across tenants
    cache_partition: bool = False  # a static partition: each tenant holds and parks at most its quota
    scrub_on_free: bool = False  # freed pages are zeroed: costly, and it hides the bug rather than fixing it


@dataclass(frozen=True)
class EngineConfig(CacheSwitches):
    """How one node serves: page size, pool size, context window, batch limits, and the cache switches."""

    page_size: int = 16  # small, so a notebook can draw every page
    num_pages: int | None = 128  # pool size in pages; or None to size it from kv_memory_bytes
    kv_memory_bytes: int | None = None  # memory budget for the pool, used when num_pages is None
    context_len: int = 1024  # the advertised window: prompt + output tokens (1,048,576 / 1,024)
    max_batch_size: int = 64  # requests running at once (serve's --max-batch, default batch_for_pool)
    max_prefill_tokens: int = 2048  # prompt tokens prefilled in one step
    chunked_prefill: bool = False  # longer prompts go max_prefill_tokens at a time, a decode step after each
    mixed_steps: bool = False  # each step decodes the running requests and prefills waiting ones beside them
    audit: bool = True  # check every read against the ownership ledger
    event_log: bool = True  # record every allocation, write, read, free and state change
    event_log_limit: int | None = None  # keep about this many recent events (a server); None: all
    prefix_caching: bool = True  # reuse cached full prompt pages across requests (prefix_cache.py)
    cache_tenants: int = 4  # tenants the partition is cut for: each one's quota is num_pages // cache_tenants

    def __post_init__(self) -> None:
        if self.num_pages is None and self.kv_memory_bytes is None:
            raise ValueError("give the pool a size: num_pages or kv_memory_bytes")
        least = {"page_size": 1, "num_pages": 1, "kv_memory_bytes": 1, "context_len": 2, "event_log_limit": 1,
                 "max_batch_size": 1, "max_prefill_tokens": 1, "cache_tenants": 1}  # None: not set
        for name, low in least.items():
            if (value := getattr(self, name)) is not None and value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")

    def pool_pages(self, model: ModelConfig) -> int:
        """Pages in the pool: as given, or as many as the memory budget holds."""
        if self.num_pages is not None:
            return self.num_pages
        pages = self.kv_memory_bytes // (model.kv_bytes_per_token * self.page_size)
        if pages < 1:
            raise ValueError(f"kv_memory_bytes={self.kv_memory_bytes} holds less than one page "
                             f"({model.kv_bytes_per_token * self.page_size} bytes); raise it")
        return pages
