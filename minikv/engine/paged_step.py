"""One step over a page pool: write K/V into slots, read them back through each request's block table,
by the **tiles** (the whole batch in one call) or the **gather** (SDPA request by request; a CPU's
prefills and small decode batches). `paged_attention_reference` is the slow, obvious version the tests
hold both to. See docs/engine.md.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from minikv.attention.dense import causal_mask, masked_attention
from minikv.attention.gather import gather_attention
from minikv.attention.tiles import TilePlan, segments, tile_plan, tiled_attention
from minikv.engine.audit import CrossReadEvent, OwnershipAudit
from minikv.engine.page_pool import PagePool

TILE_KEYS = 64  # keys per tile in prefill: large for the matrix units, small enough to skip the masked half
CPU_TILES_MIN_BATCH = 16  # on a CPU, decode batches this large take the tiles (measured crossover: 8 to 16)


@dataclass(frozen=True)
class SeqSlice:
    """One request's part of a step: `num_new` tokens appended after `start` cached ones."""

    uid: int
    block_table: list[int]
    start: int
    num_new: int

    @property
    def end(self) -> int:
        return self.start + self.num_new


def block_table_tensor(block_tables: list[list[int]], device: torch.device) -> Tensor:
    """(B, max_pages) block tables, each padded with its own first page: the padding is never attended,
    but a tile that reads it reads only its own request's data."""
    width = max(len(t) for t in block_tables)
    return torch.tensor([t + t[:1] * (width - len(t)) for t in block_tables], dtype=torch.long, device=device)


def slot_mapping(block_tables: Tensor, page_size: int, seq_ids: Tensor, positions: Tensor) -> Tensor:
    """The tensor form of `PagePool.slots`: the slot of each token at `positions` (...) of request
    `seq_ids` (...), through block_tables (B, max_pages); one indexing operation for a whole step."""
    return block_tables[seq_ids, positions // page_size] * page_size + positions % page_size  # (...)


class PagedStep:
    """Implements AttentionBackend for one forward over a batch of requests in a PagePool; queries arrive
    flat, (N, H, D) with N = sum of num_new. What every layer needs is built here once a step, as tensors."""

    def __init__(self, pool: PagePool, seqs: list[SeqSlice], audit: OwnershipAudit | None = None) -> None:
        self.pool, self.seqs, self.audit = pool, seqs, audit
        self.findings: list[CrossReadEvent] = []  # what the audit's read check returned in this forward
        device, ps = pool.kv.device, pool.page_size
        self.block_tables = block_table_tensor([s.block_table for s in seqs], device)  # (B, max_pages)
        self.starts = torch.tensor([s.start for s in seqs], device=device)  # (B,)
        self.num_new = torch.tensor([s.num_new for s in seqs], device=device)  # (B,)
        self.ends = self.starts + self.num_new  # (B,)
        assert all(len(s.block_table) * ps >= s.end for s in seqs), "a request has fewer pages than tokens"
        seq_ids, rank = segments(self.num_new)  # (N,) each new token's request and index among its new tokens
        self.positions = self.starts[seq_ids] + rank  # (N,) each new token's position in its request
        self.slot_mapping = slot_mapping(self.block_tables, ps, seq_ids, self.positions)  # (N,) where K/V go
        self.last_rows = torch.cumsum(self.num_new, 0) - 1  # (B,) each request's last new token among the N
        self.decode = max(s.num_new for s in seqs) == 1
        self.plans: dict[bool, TilePlan] = {}  # last_only -> the tiles of that read, built on first use
        ones = [b for b, s in enumerate(seqs) if s.num_new == 1]  # a mixed step's decode rows: by the tiles
        self.split = (device.type == "cpu" and not self.decode and len(ones) >= CPU_TILES_MIN_BATCH)
        if self.split:
            one = torch.tensor(ones, device=device)  # (B1,)
            self.one_rows = self.last_rows[one]  # (B1,) a 1-token request's row is its last
            self.many_rows = torch.ones(len(self.slot_mapping), dtype=torch.bool, device=device)  # (N,)
            self.many_rows[self.one_rows] = False
            self.one_plan = tile_plan(self.block_tables[one], self.starts[one], self.num_new[one], ps,
                                      pool.kv.shape[-2], block_q=1, pages_per_tile=1)
        if self.gathers(last_only=False) or audit is not None:
            key_pos = torch.arange(int(self.ends.max()), device=device)  # (S,)
            self.key_valid = key_pos[None, :] < self.ends[:, None]  # (B, S)
            self.gather = slot_mapping(self.block_tables, ps, torch.arange(len(seqs), device=device)[:, None],
                                       key_pos[None, :]) * self.key_valid  # (B, S) context slots, 0-padded
        if self.gathers(last_only=False):  # every read that gathers (last_only only where this one does)
            self.context_slots = [self.gather[b, : s.end] for b, s in enumerate(seqs)]  # (S_b,) each
        if audit is not None:  # the ledger checks every (request, slot) read, padded to (B, S)
            self.uids = torch.tensor([s.uid for s in seqs], device=device)  # (B,)
            self.writer_uids = self.uids[seq_ids]  # (N,)

    def store(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Scatter this step's new K/V (N, KVH, D) into their slots (on layer 0, tell the audit); returns the
        layer's K and V caches as (num_slots, KVH, D) views of the pool."""
        k_cache, v_cache = self.pool.flat(layer)  # (num_slots, KVH, D) views of the pool
        k_cache.index_copy_(0, self.slot_mapping, k)  # one row per new token; no slot twice
        v_cache.index_copy_(0, self.slot_mapping, v)
        if layer == 0 and self.audit is not None:  # one ledger entry per slot, not per layer
            self.audit.record_writes(self.slot_mapping, self.writer_uids, self.positions)
            self.findings += self.audit.check_reads(self.uids, self.gather, self.key_valid)
        return k_cache, v_cache

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, last_only: bool = False) -> Tensor:
        """Store every new token's K/V (N, KVH, D); attend q (N, H, D), or with `last_only` each
        request's last query only (B, H, D), over its whole context. Returns q's shape."""
        k_cache, v_cache = self.store(layer, k, v)
        last_only = last_only and not self.decode  # in decode every query is a request's last
        assert len(q) == (len(self.seqs) if last_only else len(self.slot_mapping)), "one query per row read"
        if self.split and not last_only:  # a mixed step on a CPU: one-token rows tiled, prompts gathered
            return self.split_attention(layer, q, k_cache, v_cache)
        if self.gathers(last_only):
            starts = [s.end - 1 for s in self.seqs] if last_only else [s.start for s in self.seqs]
            return gather_attention(q, k_cache, v_cache, self.context_slots, starts)
        return tiled_attention(q, self.pool.kv[layer], self.plan(last_only))  # (N or B, H, D)

    def split_attention(self, layer: int, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        """Each 1-token request's query by one tiled call, every longer request's by the gather; (N, H, D)."""
        out = torch.empty_like(q)  # (N, H, D)
        ones = tiled_attention(q[self.one_rows], self.pool.kv[layer], self.one_plan)  # (B1, H, D)
        out[self.one_rows] = ones
        many = [b for b, s in enumerate(self.seqs) if s.num_new > 1]
        out[self.many_rows] = gather_attention(q[self.many_rows], k_cache, v_cache,
                                               [self.context_slots[b] for b in many],
                                               [self.seqs[b].start for b in many])
        return out

    def gathers(self, last_only: bool) -> bool:
        """Whether a read takes the gather path: on a CPU, unless one query per request of a large batch."""
        large = (self.decode or last_only) and len(self.seqs) >= CPU_TILES_MIN_BATCH  # one query per request
        return self.pool.kv.device.type == "cpu" and not large

    def plan(self, last_only: bool) -> TilePlan:
        """The step's tiles: every new query's (prefill: blocks of TILE_KEYS), or one per request."""
        if last_only not in self.plans:
            one, ps = self.decode or last_only, self.pool.page_size
            starts = self.ends - 1 if last_only else self.starts  # (B,)
            num_new = torch.ones_like(self.num_new) if last_only else self.num_new  # (B,)
            self.plans[last_only] = tile_plan(self.block_tables, starts, num_new, ps, self.pool.kv.shape[-2],
                                              block_q=1 if one else TILE_KEYS,
                                              pages_per_tile=1 if one else max(1, TILE_KEYS // ps))
        return self.plans[last_only]


def paged_attention_reference(pool: PagePool, layer: int, seqs: list[SeqSlice], q: Tensor, k: Tensor,
                              v: Tensor) -> Tensor:
    """The slow, obvious version, for the tests only: writes as PagedStep does, then rebuilds each request's
    contiguous K/V slot by slot through its block table, in Python, and attends over it."""
    k_cache, v_cache = pool.flat(layer)
    outs, offset = [], 0
    for s in seqs:
        new_slots = pool.slots(s.block_table, s.start, s.end)
        for i, slot in enumerate(new_slots):
            k_cache[slot], v_cache[slot] = k[offset + i], v[offset + i]
        ctx = pool.slots(s.block_table, 0, s.end)
        keys = torch.stack([k_cache[slot] for slot in ctx])[None]  # (1, S, KVH, D)
        values = torch.stack([v_cache[slot] for slot in ctx])[None]
        mask = causal_mask(1, s.end, q.device, s.start)  # (1, T, S)
        outs.append(masked_attention(q[offset : offset + s.num_new][None], keys, values, mask)[0])
        offset += s.num_new
    return torch.cat(outs)  # (N, H, D)
