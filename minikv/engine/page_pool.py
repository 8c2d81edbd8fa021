"""The page pool: one KV tensor per node, cut into fixed-size pages, shared by every request.

Freeing a page only puts its number back on the free stack: **the bytes are not zeroed**, so a freed
page keeps its last owner's K/V until the next owner overwrites them: isolation rests on bookkeeping
alone. With prefix caching a page may have several holders, and a freed page with a cache key is
*parked*: free, still matchable. See docs/engine.md.
"""

import math
from collections.abc import Callable

import torch
from torch import Tensor

from minikv.engine.partition import Partition
from minikv.engine.prefix_cache import PageKey, PrefixCache
from minikv.model.devices import available_memory_bytes
from minikv.model.llama import ModelConfig


class PoolExhausted(RuntimeError):
    """allocate() was called without checking can_allocate() first."""


class PoolTooLarge(ValueError):
    """The pool asked for needs more memory than the device has; the message gives both numbers."""


def allocate_pool(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> Tensor:
    """A zeroed tensor of `shape`, or PoolTooLarge naming the bytes needed and the bytes free."""
    need = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    free = available_memory_bytes(device)
    available = f"{free:,}" if free is not None else "fewer"
    too_large = PoolTooLarge(f"a KV pool of {shape[2]:,} pages x {shape[3]} tokens needs {need:,} bytes; "
                             f"{device} has {available} bytes available: lower num_pages or page_size")
    if free is not None and need > free:
        raise too_large
    try:
        return torch.zeros(shape, device=device, dtype=dtype)  # once, at boot: runs are reproducible
    except (torch.OutOfMemoryError, RuntimeError):  # the allocator refused although the check passed
        raise too_large from None


class PagePool:
    """KV storage `[layers, 2, num_pages, page_size, kv_heads, head_dim]` plus a free list."""

    def __init__(self, config: ModelConfig, num_pages: int, page_size: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 scrub_on_free: bool = False, prefix_caching: bool = False,
                 partition_tenants: int | None = None) -> None:
        assert page_size >= 1 and num_pages >= 1, "the configs (EngineConfig, ClusterConfig) check the sizes"
        self.page_size, self.num_pages, self.capacity_tokens = page_size, num_pages, num_pages * page_size
        shape = (config.num_layers, 2, num_pages, page_size, config.num_kv_heads, config.head_dim)
        self.kv = allocate_pool(shape, torch.device(device), dtype)  # (L, 2, P, page, KVH, D)
        self.scrub_on_free = scrub_on_free  # zero a freed page (off: it keeps its data until overwritten)
        self.on_scrub: Callable[[list[int]], None] | None = None  # told which pages were just zeroed
        self.free_pages: list[int] = list(reversed(range(num_pages)))  # stack: pop() -> page 0 first
        self.holders: list[list[str]] = [[] for _ in range(num_pages)]  # request ids holding each page
        self.num_held = 0  # pages with at least one holder
        self.prefix_cache = PrefixCache(page_size) if prefix_caching else None
        self.partition = Partition(num_pages, partition_tenants) if partition_tenants else None
        # the most tokens one tenant's requests can ever hold at once: its quota's, or the whole pool's
        self.tenant_tokens = (self.partition.quota if self.partition else num_pages) * page_size

    # -- capacity -----------------------------------------------------------------------
    def occupancy(self) -> dict[str, int]:
        """What a server's /health shows of this pool: free and total pages."""
        return {"free_pages": self.num_free_pages, "total_pages": self.num_pages}

    @property
    def num_free_pages(self) -> int:
        """Pages allocate() can hand out: the stack, and cached pages nobody holds (evictable)."""
        return len(self.free_pages) + (self.prefix_cache.num_parked if self.prefix_cache else 0)

    def ref_count(self, page: int) -> int:
        return len(self.holders[page])

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.page_size)

    # -- allocation (check, then act) ---------------------------------------------------
    def match(self, keys: list[PageKey], num_tokens: int, tenant: str) -> list[int]:
        """`tenant`'s prefix-cache hits for a prompt of `num_tokens` tokens: the cache's, stopped at the first
        page that counts against another tenant when partitioned (a hit would read into another's quota)."""
        hits = self.prefix_cache.match(keys, num_tokens) if self.prefix_cache else []
        if self.partition is not None:
            mine = [self.partition.tenant_of[p] == tenant for p in hits]
            hits = hits[: mine.index(False)] if False in mine else hits
        return hits

    def can_allocate(self, num_pages: int, cached: list[int] = (), tenant: str | None = None) -> bool:
        """Whether `num_pages` new pages are there for `tenant` once it holds its `cached` hits: the stack and
        anyone's parked pages; partitioned, its quota's room plus its own parked."""
        if self.partition is None:
            parked = self.prefix_cache.evictable(None, cached) if self.prefix_cache else 0
            return num_pages <= len(self.free_pages) + parked
        assert tenant is not None, "a partitioned pool allocates for a tenant"
        own_parked = self.prefix_cache.evictable(tenant, cached) if self.prefix_cache else 0
        return num_pages <= self.partition.room(tenant) + own_parked

    def allocate(self, num_pages: int, owner: str, cached: list[int] = (),
                 tenant: str | None = None) -> list[int]:
        """Hold the `cached` prefix-cache hits (unparking them) and `num_pages` new pages for `owner`: off the
        stack, then evicting parked pages (LRU first; partitioned, `tenant`'s own at its quota)."""
        if not self.can_allocate(num_pages, cached, tenant):
            raise PoolExhausted(f"{owner} asked for {num_pages} pages, {self.num_free_pages} free")
        for p in cached:
            assert self.prefix_cache is not None and self.prefix_cache.is_cached(p), f"page {p} is not cached"
            if not self.holders[p]:
                self.prefix_cache.unpark(p)
                self.num_held += 1
            self.holders[p].append(owner)
        pages = [self._new_page(tenant) for _ in range(num_pages)]
        for p in pages:
            assert not self.holders[p], f"page {p} handed out while held by {self.holders[p]}"
            self.holders[p].append(owner)
        self.num_held += len(pages)
        return pages

    def _new_page(self, tenant: str | None) -> int:
        """One page for new data: see allocate()."""
        if self.partition is None:
            return self.free_pages.pop() if self.free_pages else self.prefix_cache.evict(None)
        if self.partition.room(tenant) > 0:
            assert self.free_pages, "a tenant under its quota found the stack empty: the quotas overlap"
            page = self.free_pages.pop()
            self.partition.attribute(page, tenant)
            return page
        return self.prefix_cache.evict(tenant)  # its own, so it stays attributed to it

    def free(self, pages: list[int], owner: str, tenant: str = "") -> None:
        """Give `owner`'s hold on `pages` back. A page nobody holds then is parked if it has a cache key
        (still `tenant`'s), else pushed on the stack. The data stays, unless the pool scrubs on free."""
        emptied = []
        for p in reversed(pages):
            assert owner in self.holders[p], f"{owner} freed page {p} held by {self.holders[p]}"
            self.holders[p].remove(owner)
            if self.holders[p]:
                continue  # still shared: the others keep reading it
            emptied.append(p)
            self.num_held -= 1
            assert not self.partition or self.partition.tenant_of[p] == tenant, f"page {p}: not {tenant!r}'s"
            if self.prefix_cache is not None and self.scrub_on_free:
                self.prefix_cache.forget(p)  # scrubbed data no longer matches its key
            if self.prefix_cache is not None and self.prefix_cache.is_cached(p):
                self.prefix_cache.park(p, tenant)
                continue
            if self.partition is not None:
                self.partition.release(p)
            self.free_pages.append(p)
        if self.scrub_on_free and emptied:
            self.write(emptied, 0.0)  # the costly option: one write per freed page
            if self.on_scrub is not None:
                self.on_scrub(emptied)  # e.g. the audit: these slots now hold what nobody wrote

    def write(self, pages: list[int], kv: Tensor | float) -> None:
        """Overwrite whole `pages` of every layer with `kv` (L, 2, n, page, KVH, D) or one value: a transfer
        landing, a canary, a scrub. (A forward writes its own tokens' slots through `flat`.)"""
        self.kv[:, :, pages] = kv.to(self.kv.device) if isinstance(kv, Tensor) else kv

    # -- slots --------------------------------------------------------------------------
    def slots(self, block_table: list[int], start: int, end: int) -> list[int]:
        """Slot numbers (page * page_size + offset) of token positions start..end-1."""
        ps = self.page_size
        return [block_table[i // ps] * ps + i % ps for i in range(start, end)]

    def flat_all(self) -> tuple[Tensor, Tensor]:
        """K and V of every layer viewed as (L, num_slots, KVH, D), sharing storage."""
        k, v = self.kv[:, 0], self.kv[:, 1]  # (L, P, page, KVH, D) each
        return k.view(k.shape[0], -1, *k.shape[-2:]), v.view(v.shape[0], -1, *v.shape[-2:])

    def flat(self, layer: int) -> tuple[Tensor, Tensor]:
        """Layer `layer`'s K and V viewed as (num_slots, KVH, D), sharing storage."""
        k, v = self.flat_all()
        return k[layer], v[layer]

    def check_integrity(self, live: set[str] | None = None) -> None:
        """Every page is exactly one of: on the stack (no key), parked (a key), held (by `live` requests only,
        when given)."""
        assert len(set(self.free_pages)) == len(self.free_pages), "a page is on the free list twice"
        parked = set(self.prefix_cache.parked) if self.prefix_cache else set()
        on_stack = set(self.free_pages)
        assert self.num_held == sum(1 for h in self.holders if h), "the held count drifted"
        for p in range(self.num_pages):
            held = bool(self.holders[p])
            assert len(set(self.holders[p])) == len(self.holders[p]), f"page {p} held twice by one request"
            assert [p in on_stack, p in parked, held].count(True) == 1, \
                f"page {p}: on stack {p in on_stack}, parked {p in parked}, holders {self.holders[p]}"
            if p in on_stack and self.prefix_cache:
                assert not self.prefix_cache.is_cached(p), f"page {p} is on the stack with a cache key"
            assert live is None or set(self.holders[p]) <= live, f"page {p}: {self.holders[p]}, not all live"
        if self.prefix_cache:
            self.prefix_cache.check()
        if self.partition:
            self.partition.check(self.free_pages)
