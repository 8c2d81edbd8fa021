"""The page pool: one KV tensor per node, cut into fixed-size pages, shared by every request.

Allocated once. A request takes pages when admitted and gives them back when it ends; freeing only
puts page numbers back on the free list. **The bytes are not zeroed** (that would cost a write per
freed page), so a freed page keeps its last owner's keys and values until the next owner overwrites
them: isolation between tenants rests entirely on this bookkeeping. The free list is a stack, and a
request's pages go back in reverse, so the next request receives them in the same order: in a leak,
the stale data a new request sees is the *most recent* tenant's.

With prefix caching (prefix_cache.py) a page can be held by several requests (`holders`; the ref
count is their number). A freed page with a cache key is *parked* instead of stacked: free, still
matchable; `allocate` takes from the stack first and evicts parked pages (least recently used
first) only when the stack is empty, as SGLang does. A page is never handed out while held.
"""


from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from minikv.model.devices import available_memory_bytes
from minikv.model.llama import ModelConfig
from minikv.engine.prefix_cache import PrefixCache


class PoolExhausted(RuntimeError):
    """allocate() was called without checking can_allocate() first."""


class PoolTooLarge(ValueError):
    """The pool asked for needs more memory than the device has; the message gives both numbers."""


def allocate_pool(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> Tensor:
    """An uninitialised tensor of `shape`, or PoolTooLarge naming the bytes needed and the bytes free."""
    need = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    free = available_memory_bytes(device)
    num_pages, page_size = shape[2], shape[3]
    too_large = (f"a KV pool of {num_pages:,} pages x {page_size} tokens needs {need:,} bytes; "
                 f"{device} has {{}} bytes available: lower num_pages or page_size")
    if free is not None and need > free:
        raise PoolTooLarge(too_large.format(f"{free:,}"))
    try:
        return torch.empty(shape, device=device, dtype=dtype)
    except (torch.OutOfMemoryError, RuntimeError):  # the allocator refused although the check passed
        raise PoolTooLarge(too_large.format(f"{free:,}" if free is not None else "fewer")) from None


class PagePool:
    """KV storage `[layers, 2, num_pages, page_size, kv_heads, head_dim]` plus a free list."""

    def __init__(self, config: ModelConfig, num_pages: int, page_size: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 scrub_on_free: bool = False, prefix_caching: bool = False, tenant_pages: int | None = None) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1 token, got {page_size}")
        if num_pages < 1:
            raise ValueError(f"a pool needs at least one page, got num_pages={num_pages}")
        self.page_size, self.num_pages = page_size, num_pages
        shape = (config.num_layers, 2, num_pages, page_size, config.num_kv_heads, config.head_dim)
        self.kv = allocate_pool(shape, torch.device(device), dtype)  # (L, 2, P, page, KVH, D)
        # Fresh memory holds whatever was there before; fill it once at boot so that runs are
        # reproducible. This is the only time the pool is cleared (unless scrub_on_free).
        self.kv.zero_()
        self.scrub_on_free = scrub_on_free
        self.on_scrub: Callable[[list[int]], None] | None = None  # told which pages were just zeroed
        self.free_pages: list[int] = list(reversed(range(num_pages)))  # stack: pop() -> page 0 first
        self.holders: list[list[str]] = [[] for _ in range(num_pages)]  # request ids holding each page
        self.num_held = 0  # pages with at least one holder
        self.prefix_cache = PrefixCache(page_size, tenant_pages) if prefix_caching else None

    # -- capacity -----------------------------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    def occupancy(self) -> dict[str, int]:
        """What a server's /health shows of this pool: free and total pages."""
        return {"free_pages": self.num_free_pages, "total_pages": self.num_pages}

    @property
    def num_free_pages(self) -> int:
        """Pages allocate() can hand out: the stack, and cached pages nobody holds (evictable)."""
        return len(self.free_pages) + (self.prefix_cache.num_parked if self.prefix_cache else 0)

    def owner_of(self, page: int) -> str | None:
        """The first request holding `page` (the one that allocated it, unless it left), or None."""
        return self.holders[page][0] if self.holders[page] else None

    def ref_count(self, page: int) -> int:
        return len(self.holders[page])

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.page_size)

    # -- allocation (check, then act) ---------------------------------------------------
    def can_allocate(self, num_pages: int, cached: list[int] = (), tenant: str | None = None) -> bool:
        """Whether `num_pages` new pages are free for a request of `tenant` once it holds its `cached`
        hits: the stack, and the parked pages it may evict (its own, with a partitioned cache; anyone's
        when the pool is idle, since nothing else would ever free a page)."""
        parked = self.prefix_cache.evictable(self._evictor(tenant), cached) if self.prefix_cache else 0
        return num_pages <= len(self.free_pages) + parked

    def _evictor(self, tenant: str | None) -> str | None:
        return None if self.num_held == 0 else tenant

    def allocate(self, num_pages: int, owner: str, cached: list[int] = (), tenant: str | None = None) -> list[int]:
        """`cached` (prefix-cache hits: one more holder each, held again if parked), then `num_pages`
        new pages for `owner`: off the stack, then evicting parked pages `tenant` may take (LRU). Returns the new pages."""
        if not self.can_allocate(num_pages, cached, tenant):
            raise PoolExhausted(f"{owner} asked for {num_pages} pages, {self.num_free_pages} free")
        evictor = self._evictor(tenant)
        for p in cached:
            assert self.prefix_cache is not None and self.prefix_cache.is_cached(p), f"page {p} is not cached"
            if not self.holders[p]:
                self.prefix_cache.unpark(p)
                self.num_held += 1
            self.holders[p].append(owner)
        if cached:
            self.prefix_cache.hits += len(cached)
        pages = [self.free_pages.pop() if self.free_pages else self.prefix_cache.evict(evictor) for _ in range(num_pages)]
        for p in pages:
            assert not self.holders[p], f"page {p} handed out while held by {self.holders[p]}"
            self.holders[p].append(owner)
        self.num_held += len(pages)
        return pages

    def free(self, pages: list[int], owner: str, tenant: str = "") -> None:
        """Give `owner`'s hold on `pages` back. A page nobody holds any more is parked (in `tenant`'s
        share) if it has a cache key, else pushed on the stack. The data stays, unless the pool scrubs on free."""
        emptied = []
        for p in reversed(pages):
            assert owner in self.holders[p], f"{owner} freed page {p} held by {self.holders[p]}"
            self.holders[p].remove(owner)
            if self.holders[p]:
                continue  # still shared: the others keep reading it
            emptied.append(p)
            self.num_held -= 1
            if self.prefix_cache is not None and self.scrub_on_free:
                self.prefix_cache.forget(p)  # scrubbed data no longer matches its key
            spilled = self.prefix_cache.park(p, tenant) if self.prefix_cache and self.prefix_cache.is_cached(p) else p
            if spilled is not None:
                self.free_pages.append(spilled)  # keyless, or the tenant's oldest past its share
        if self.scrub_on_free and emptied:
            self.kv[:, :, emptied] = 0  # the costly option: one write per freed page
            if self.on_scrub is not None:
                self.on_scrub(emptied)  # e.g. the audit: these slots now hold what nobody wrote

    # -- slots --------------------------------------------------------------------------
    def slots(self, block_table: list[int], start: int, end: int) -> list[int]:
        """Slot numbers (page * page_size + offset) of token positions start..end-1."""
        ps = self.page_size
        return [block_table[i // ps] * ps + i % ps for i in range(start, end)]

    def flat(self, layer: int) -> tuple[Tensor, Tensor]:
        """Layer `layer`'s K and V viewed as (num_slots, KVH, D), sharing storage."""
        k, v = self.kv[layer]  # (P, page, KVH, D) each
        return k.view(-1, *k.shape[-2:]), v.view(-1, *v.shape[-2:])

    def flat_all(self) -> tuple[Tensor, Tensor]:
        """K and V of every layer viewed as (L, num_slots, KVH, D), sharing storage."""
        k, v = self.kv[:, 0], self.kv[:, 1]  # (L, P, page, KVH, D) each
        return k.view(k.shape[0], -1, *k.shape[-2:]), v.view(v.shape[0], -1, *v.shape[-2:])

    def check_integrity(self) -> None:
        """Every page is exactly one of: on the stack (no key), parked (a key), held; never twice."""
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
        if self.prefix_cache:
            self.prefix_cache.check()
