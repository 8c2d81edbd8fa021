"""The page pool: one KV tensor per node, cut into fixed-size pages, shared by every request.

Allocated once. A request takes pages when admitted and gives them back when it ends; freeing
only puts page numbers back on the free list. **The bytes are not zeroed** (that would cost a
memory write per freed page), so a freed page keeps its last owner's keys and values until the
next owner overwrites them. Isolation between tenants rests entirely on this bookkeeping.

The free list is a stack: the most recently freed page is handed out first, and a request's
pages are pushed back in reverse so that the next request receives them in the same order.
That is why, in a leak, the stale data a new request sees is the *most recent* tenant's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minikv.model import ModelConfig


class PoolExhausted(RuntimeError):
    """allocate() was called without checking can_allocate() first."""


class PagePool:
    """KV storage `[layers, 2, num_pages, page_size, kv_heads, head_dim]` plus a free list."""

    def __init__(self, config: ModelConfig, num_pages: int, page_size: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 scrub_on_free: bool = False) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1 token, got {page_size}")
        if num_pages < 1:
            raise ValueError(f"a pool needs at least one page, got num_pages={num_pages}")
        self.page_size, self.num_pages = page_size, num_pages
        shape = (config.num_layers, 2, num_pages, page_size, config.num_kv_heads, config.head_dim)
        self.kv = torch.empty(shape, device=device, dtype=dtype)  # (L, 2, P, page, KVH, D)
        # Fresh memory holds whatever was there before; fill it once at boot so that runs are
        # reproducible. This is the only time the pool is cleared (unless scrub_on_free).
        self.kv.zero_()
        self.scrub_on_free = scrub_on_free
        self.free_pages: list[int] = list(reversed(range(num_pages)))  # stack: pop() -> page 0 first
        self.owner: list[str | None] = [None] * num_pages  # request id holding each page

    # -- capacity -----------------------------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def num_free_pages(self) -> int:
        return len(self.free_pages)

    @property
    def bytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.page_size)

    # -- allocation (check, then act) ---------------------------------------------------
    def can_allocate(self, num_pages: int) -> bool:
        return num_pages <= len(self.free_pages)

    def allocate(self, num_pages: int, owner: str) -> list[int]:
        """Take `num_pages` pages off the free list for `owner`. O(1) per page."""
        if not self.can_allocate(num_pages):
            raise PoolExhausted(f"{owner} asked for {num_pages} pages, {len(self.free_pages)} free")
        pages = [self.free_pages.pop() for _ in range(num_pages)]
        for p in pages:
            assert self.owner[p] is None, f"page {p} handed out while owned by {self.owner[p]}"
            self.owner[p] = owner
        return pages

    def free(self, pages: list[int], owner: str) -> None:
        """Give `owner`'s pages back. The data stays, unless the pool scrubs on free."""
        for p in reversed(pages):
            assert self.owner[p] == owner, f"{owner} freed page {p} owned by {self.owner[p]}"
            self.owner[p] = None
            self.free_pages.append(p)
        if self.scrub_on_free and pages:
            self.kv[:, :, pages] = 0  # the costly option: one write per freed page

    # -- slots --------------------------------------------------------------------------
    def slots(self, block_table: list[int], start: int, end: int) -> list[int]:
        """Slot numbers (page * page_size + offset) of token positions start..end-1."""
        ps = self.page_size
        return [block_table[i // ps] * ps + i % ps for i in range(start, end)]

    def block_table_tensor(self, block_tables: list[list[int]]) -> Tensor:
        """(B, max_pages) block tables on the pool's device, each padded with its own first page.

        The padding is never attended, but a tile that reads it then reads only its own request's data.
        """
        width = max(len(t) for t in block_tables)
        return torch.tensor([t + t[:1] * (width - len(t)) for t in block_tables], dtype=torch.long, device=self.kv.device)

    def slot_mapping(self, block_tables: Tensor, seq_ids: Tensor, positions: Tensor) -> Tensor:
        """The tensor form of `slots`: the slot of each token at `positions` (...) of request `seq_ids` (...).

        block_tables (B, max_pages) from `block_table_tensor`; one indexing operation for a whole step.
        """
        ps = self.page_size
        return block_tables[seq_ids, positions // ps] * ps + positions % ps  # (...)

    def flat(self, layer: int) -> tuple[Tensor, Tensor]:
        """Layer `layer`'s K and V viewed as (num_slots, KVH, D), sharing storage."""
        k, v = self.kv[layer]  # (P, page, KVH, D) each
        return k.view(-1, *k.shape[-2:]), v.view(-1, *v.shape[-2:])

    def flat_all(self) -> tuple[Tensor, Tensor]:
        """K and V of every layer viewed as (L, num_slots, KVH, D), sharing storage."""
        k, v = self.kv[:, 0], self.kv[:, 1]  # (L, P, page, KVH, D) each
        return k.view(k.shape[0], -1, *k.shape[-2:]), v.view(v.shape[0], -1, *v.shape[-2:])

    def check_integrity(self) -> None:
        """Every page is either free (no owner) or owned, never both, never twice free."""
        assert len(set(self.free_pages)) == len(self.free_pages), "a page is on the free list twice"
        for p in range(self.num_pages):
            assert (p in self.free_pages) == (self.owner[p] is None), f"page {p}: free list and owner disagree"
