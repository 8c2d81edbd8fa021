"""Paged attention: write K/V into slots, read them back through each request's block table.

A request's tokens live in pages scattered over the pool; its block table lists them in
order. Token i of a request sits in slot `block_table[i // page_size] * page_size + i % page_size`.
One step handles a batch of requests that each add some new tokens (a prompt in prefill, one
token in decode): the new K/V are scattered into their slots, then each request's whole
context is gathered through its block table and attended with plain SDPA. That gather is the
only difference from a contiguous cache, and `paged_attention_reference` checks it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from minikv.attention import masked_attention
from minikv.audit import CrossReadEvent, OwnershipAudit
from minikv.page_pool import PagePool


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

    Queries arrive flat, (N, H, D) with N = sum of num_new. Each request then reads exactly its
    own context, (S_b, KVH, D) gathered through its block table, and attends over it: a batch
    whose requests hold 30 and 600 tokens gathers 630 keys, not 2 x 600 padded ones (what a
    varlen attention kernel does on a GPU in one launch).
    """

    def __init__(self, pool: PagePool, seqs: list[SeqSlice], audit: OwnershipAudit | None = None) -> None:
        self.pool, self.seqs, self.audit = pool, seqs, audit
        self.findings: list[CrossReadEvent] = []  # what the audit's read check returned in this forward
        device = pool.kv.device
        self.slot_mapping = torch.tensor(
            [slot for s in seqs for slot in pool.slots(s.block_table, s.start, s.end)], device=device
        )  # (N,) where each new token's K/V goes
        self.context_slots = [torch.tensor(pool.slots(s.block_table, 0, s.end), device=device) for s in seqs]  # (S_b,)
        # causal within the request; a single new token may see its whole context, so no mask
        self.masks = [None if s.num_new == 1 else
                      (torch.arange(s.end)[None, :] <= torch.arange(s.start, s.end)[:, None]).to(device)[None]
                      for s in seqs]  # (1, T_b, S_b) or None
        if audit is not None:  # the ledger checks every (request, slot) read, padded to (B, S)
            S = max(s.end for s in seqs)
            self.gather = torch.zeros(len(seqs), S, dtype=torch.long, device=device)  # (B, S), 0-padded
            for b, slots in enumerate(self.context_slots):
                self.gather[b, : len(slots)] = slots
            ctx_len = torch.tensor([s.end for s in seqs], device=device)
            self.key_valid = torch.arange(S, device=device)[None, :] < ctx_len[:, None]  # (B, S)
            self.uids = torch.tensor([s.uid for s in seqs], device=device)
            self.writer_uids = torch.tensor([s.uid for s in seqs for _ in range(s.num_new)], device=device)
            self.writer_positions = torch.tensor([i for s in seqs for i in range(s.start, s.end)], device=device)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        k_cache, v_cache = self.pool.flat(layer)  # (num_slots, KVH, D) views of the pool
        k_cache[self.slot_mapping] = k  # k: (N, KVH, D)
        v_cache[self.slot_mapping] = v
        if layer == 0 and self.audit is not None:  # one ledger entry per slot, not per layer
            self.audit.record_writes(self.slot_mapping, self.writer_uids, self.writer_positions)
            self.findings += self.audit.check_reads(self.uids, self.gather, self.key_valid)
        outs, offset = [], 0
        for s, slots, mask in zip(self.seqs, self.context_slots, self.masks):
            keys = k_cache.index_select(0, slots)[None]  # (1, S_b, KVH, D)
            values = v_cache.index_select(0, slots)[None]
            queries = q[offset : offset + s.num_new][None]  # (1, T_b, H, D)
            outs.append(masked_attention(queries, keys, values, mask)[0])  # (T_b, H, D)
            offset += s.num_new
        return torch.cat(outs)  # (N, H, D)


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
