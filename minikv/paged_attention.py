"""Paged attention: write K/V into slots, read them back through each request's block table.

A request's tokens live in pages scattered over the pool; its block table lists them in
order. Token i of a request sits in slot `block_table[i // page_size] * page_size + i % page_size`.
One step handles a batch of requests that each add some new tokens (a prompt in prefill, one
token in decode): the new K/V are scattered into their slots, then every request attends over
its own context, read through its block table.

Three ways to do that read, each checked against the others in the tests:
- tiles: one `tiled_attention` call per layer for the whole batch (varlen_attention.py),
  reading keys page by page, nothing padded to the longest request;
- per request: each request's context gathered with `index_select` and attended with SDPA
  (`gather_attention`; a whole prompt takes SDPA's causal case, with no mask to read);
  `paged_attention_gather` is this path with Python-built slot lists;
- `paged_attention_reference`: slot by slot in Python, the obviously correct version.

`PagedStep` uses the tiles on a GPU for every step, where a loop over requests is a loop of kernel
launches. On a CPU it uses them to decode a batch of at least `CPU_TILES_MIN_BATCH` requests, and
goes request by request otherwise: a prefill brings tens to hundreds of queries per request, so
one fused SDPA call per request costs less than the tiles' separate matmul, mask and softmax
passes, and a small batch costs less than the ~30 operations that plan the tiles (both measured
in README.md's benchmark section).

The last layer of a forward needs only each request's last token's output (the one whose
logits are sampled), so `attend_last` stores every new token's K/V but attends only those
queries: a decode-shaped read, whatever the phase (Llama.forward decides when).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from minikv.attention import masked_attention
from minikv.audit import CrossReadEvent, OwnershipAudit
from minikv.page_pool import PagePool
from minikv.varlen_attention import TilePlan, segments, tile_plan, tiled_attention

TILE_KEYS = 64  # keys per tile in prefill: large enough for the matrix units, small enough to skip the masked half
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


class PagedStep:
    """Implements AttentionBackend for one forward over a batch of requests in a PagePool.

    Queries arrive flat, (N, H, D) with N = sum of num_new. Everything a layer needs is built
    here once per step, as tensors: the block tables (B, max_pages), each new token's position
    and slot, and either the tile plan or each request's context slots. Each layer then makes one
    scatter (the new K/V) and either one tiled attention call for the whole batch or one SDPA call
    per request (which one: the module docstring). The last layer of a forward that keeps only
    each request's last logits calls `attend_last` instead (Llama.forward).
    """

    def __init__(self, pool: PagePool, seqs: list[SeqSlice], audit: OwnershipAudit | None = None) -> None:
        self.pool, self.seqs, self.audit = pool, seqs, audit
        self.findings: list[CrossReadEvent] = []  # what the audit's read check returned in this forward
        device, ps = pool.kv.device, pool.page_size
        self.block_tables = pool.block_table_tensor([s.block_table for s in seqs])  # (B, max_pages)
        starts = torch.tensor([s.start for s in seqs], device=device)  # (B,)
        num_new = torch.tensor([s.num_new for s in seqs], device=device)  # (B,)
        ends = starts + num_new  # (B,)
        assert bool((self.block_tables.new_tensor([len(s.block_table) for s in seqs]) * ps >= ends).all()), \
            "a request has fewer pages than tokens"
        seq_ids, rank = segments(num_new)  # (N,) each new token's request and index among its new tokens
        self.positions = starts[seq_ids] + rank  # (N,) each new token's position in its request
        self.slot_mapping = pool.slot_mapping(self.block_tables, seq_ids, self.positions)  # (N,) where its K/V go
        self.last_rows = torch.cumsum(num_new, 0) - 1  # (B,) each request's last new token among the N
        self.decode = max(s.num_new for s in seqs) == 1
        self.ends, self.num_new = ends, num_new  # (B,) each, for attend_last's tiles
        tiles = device.type != "cpu" or (self.decode and len(seqs) >= CPU_TILES_MIN_BATCH)
        self.plan: TilePlan | None = None
        self.context_slots: list[Tensor] = []  # request by request only
        self.query_starts = [s.start for s in seqs]  # each request's first query position, for gather_attention
        self.context_ends = [s.end for s in seqs]
        if tiles:
            self.plan = tile_plan(self.block_tables, starts, num_new, ps, pool.kv.shape[-2],
                                  block_q=1 if self.decode else TILE_KEYS,
                                  pages_per_tile=1 if self.decode else max(1, TILE_KEYS // ps))
        self._last_plan: TilePlan | None = self.plan if self.decode else None  # attend_last's tiles, built on demand
        self.last_tiles = device.type != "cpu" or len(seqs) >= CPU_TILES_MIN_BATCH
        key_pos = torch.arange(int(ends.max()), device=device)  # (S,)
        if self.plan is None or audit is not None:
            self.key_valid = key_pos[None, :] < ends[:, None]  # (B, S)
            self.gather = pool.slot_mapping(self.block_tables, torch.arange(len(seqs), device=device)[:, None],
                                            key_pos[None, :]) * self.key_valid  # (B, S) context slots, 0-padded
            self.context_slots = [self.gather[b, : s.end] for b, s in enumerate(seqs)]  # (S_b,) each
        if audit is not None:  # the ledger checks every (request, slot) read, padded to (B, S)
            self.uids = torch.tensor([s.uid for s in seqs], device=device)  # (B,)
            self.writer_uids = self.uids[seq_ids]  # (N,)

    def store(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Scatter this step's new K/V (N, KVH, D) into their slots; on layer 0, tell the audit.

        Returns the layer's K and V caches as (num_slots, KVH, D) views of the pool.
        """
        k_cache, v_cache = self.pool.flat(layer)  # (num_slots, KVH, D) views of the pool
        k_cache.index_copy_(0, self.slot_mapping, k)  # one row per new token; no slot twice
        v_cache.index_copy_(0, self.slot_mapping, v)
        if layer == 0 and self.audit is not None:  # one ledger entry per slot, not per layer
            self.audit.record_writes(self.slot_mapping, self.writer_uids, self.positions)
            self.findings += self.audit.check_reads(self.uids, self.gather, self.key_valid)
        return k_cache, v_cache

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        k_cache, v_cache = self.store(layer, k, v)
        if self.plan is None:
            return gather_attention(q, k_cache, v_cache, self.context_slots, self.query_starts)
        return tiled_attention(q, self.pool.kv[layer], self.plan)  # (N, H, D)

    def attend_last(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Store every new token's K/V (N, KVH, D), but attend only each request's last query, q (B, H, D).

        The last layer of a forward whose logits are kept only at `last_rows` needs nothing more
        (Llama.forward): every other token's output there would be thrown away. Each last query
        sees its request's whole context, so this is a decode-shaped step whatever the phase.
        """
        assert q.shape[0] == len(self.seqs), f"{q.shape[0]} queries for {len(self.seqs)} requests"
        if self.decode:
            return self.attend(layer, q, k, v)
        k_cache, v_cache = self.store(layer, k, v)
        if not self.last_tiles:
            return gather_attention(q, k_cache, v_cache, self.context_slots, [end - 1 for end in self.context_ends])
        if self._last_plan is None:
            self._last_plan = tile_plan(self.block_tables, self.ends - 1, torch.ones_like(self.num_new),
                                        self.pool.page_size, self.pool.kv.shape[-2], block_q=1, pages_per_tile=1)
        return tiled_attention(q, self.pool.kv[layer], self._last_plan)  # (B, H, D)


def causal_mask_after(start: int, end: int, device: torch.device) -> Tensor | None:
    """(1, T, S) mask of queries start..end-1 over keys 0..end-1; None for a single query (it sees all)."""
    if end - start == 1:
        return None
    return (torch.arange(end, device=device)[None, :] <= torch.arange(start, end, device=device)[:, None])[None]


def gather_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, context_slots: list[Tensor],
                     starts: list[int]) -> Tensor:
    """Request by request: gather its context (S_b,) slots from the (num_slots, KVH, D) caches, run SDPA.

    q (N, H, D) holds the requests' queries one after another: request b's are positions
    starts[b] .. S_b - 1, each seeing keys 0 up to its own position. A whole prompt (start 0) is
    SDPA's own causal case, which skips the hidden half instead of reading a mask. A batch whose
    requests hold 30 and 600 tokens gathers 630 keys, not 2 x 600 padded ones, but pays one gather
    and one SDPA launch per request per layer.
    """
    outs, offset = [], 0
    for slots, start in zip(context_slots, starts):
        end = slots.shape[0]
        num_new = end - start
        keys = k_cache.index_select(0, slots)[None]  # (1, S_b, KVH, D)
        values = v_cache.index_select(0, slots)[None]
        mask = causal_mask_after(start, end, q.device) if start > 0 else None  # (1, T_b, S_b) or None
        out = masked_attention(q[offset : offset + num_new][None], keys, values, mask, is_causal=start == 0 and num_new > 1)
        outs.append(out[0])  # (T_b, H, D)
        offset += num_new
    return torch.cat(outs)  # (N, H, D)


def paged_attention_gather(pool: PagePool, layer: int, seqs: list[SeqSlice], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The per-request path with its slots listed in Python (minikv's fast path before the tiles).

    Writes exactly as PagedStep does. Used by tests, as a second reference for the tiles.
    """
    k_cache, v_cache = pool.flat(layer)
    device = k_cache.device
    slot_mapping = torch.tensor([slot for s in seqs for slot in pool.slots(s.block_table, s.start, s.end)], device=device)
    k_cache[slot_mapping], v_cache[slot_mapping] = k, v
    context_slots = [torch.tensor(pool.slots(s.block_table, 0, s.end), device=device) for s in seqs]
    return gather_attention(q, k_cache, v_cache, context_slots, [s.start for s in seqs])


def paged_attention_reference(pool: PagePool, layer: int, seqs: list[SeqSlice], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The slow, obvious version: one request at a time, slot by slot, in Python.

    Writes exactly as PagedStep does, then rebuilds each request's contiguous K/V by walking its
    block table token by token and attends over it. Used only by tests.
    """
    k_cache, v_cache = pool.flat(layer)
    outs, offset = [], 0
    for s in seqs:
        new_slots = pool.slots(s.block_table, s.start, s.end)
        for i, slot in enumerate(new_slots):
            k_cache[slot], v_cache[slot] = k[offset + i], v[offset + i]
        ctx = pool.slots(s.block_table, 0, s.end)
        keys = torch.stack([k_cache[slot] for slot in ctx])[None]  # (1, S, KVH, D)
        values = torch.stack([v_cache[slot] for slot in ctx])[None]
        q_pos = torch.arange(s.start, s.end)
        mask = (torch.arange(s.end)[None, :] <= q_pos[:, None])[None]  # (1, T, S)
        outs.append(masked_attention(q[offset : offset + s.num_new][None], keys, values, mask)[0])
        offset += s.num_new
    return torch.cat(outs)  # (N, H, D)
