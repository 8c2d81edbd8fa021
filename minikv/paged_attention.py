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
from minikv.audit import OwnershipAudit
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

    Queries arrive flat, (N, H, D) with N = sum of num_new; they are padded to (B, T, H, D),
    the context is gathered to (B, S, KVH, D), and the result is flattened back.
    """

    def __init__(self, pool: PagePool, seqs: list[SeqSlice], audit: OwnershipAudit | None = None) -> None:
        self.pool, self.seqs, self.audit = pool, seqs, audit
        device = pool.kv.device
        B = len(seqs)
        T = max(s.num_new for s in seqs)
        S = max(s.end for s in seqs)
        self.slot_mapping = torch.tensor(
            [slot for s in seqs for slot in pool.slots(s.block_table, s.start, s.end)], device=device
        )  # (N,) where each new token's K/V goes
        gather = torch.zeros(B, S, dtype=torch.long)  # (B, S) slots of each context, 0-padded
        q_index = torch.zeros(B, T, dtype=torch.long)  # (B, T) row of each query in the flat batch
        q_valid = torch.zeros(B, T, dtype=torch.bool)
        q_pos = torch.zeros(B, T, dtype=torch.long)
        ctx_len = torch.zeros(B, dtype=torch.long)
        offset = 0
        for b, s in enumerate(seqs):
            gather[b, : s.end] = torch.tensor(pool.slots(s.block_table, 0, s.end))
            q_index[b, : s.num_new] = torch.arange(offset, offset + s.num_new)
            q_valid[b, : s.num_new] = True
            q_pos[b, : s.num_new] = torch.arange(s.start, s.end)
            ctx_len[b] = s.end
            offset += s.num_new
        key_pos = torch.arange(S)
        self.key_valid = (key_pos[None, :] < ctx_len[:, None]).to(device)  # (B, S)
        # causal within the request; padded query rows may see key 0 so softmax stays finite
        mask = key_pos[None, None, :] <= q_pos[:, :, None]  # (B, T, S)
        self.mask = (mask & self.key_valid.cpu()[:, None, :]).to(device)
        self.gather, self.q_index, self.q_valid = gather.to(device), q_index.to(device), q_valid.to(device)
        self.flat_rows = q_valid.flatten().nonzero().flatten().to(device)  # (N,) valid rows of (B*T)
        self.uids = torch.tensor([s.uid for s in seqs], device=device)
        self.writer_uids = torch.tensor([s.uid for s in seqs for _ in range(s.num_new)], device=device)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        k_cache, v_cache = self.pool.flat(layer)  # (num_slots, KVH, D) views of the pool
        k_cache[self.slot_mapping] = k  # k: (N, KVH, D)
        v_cache[self.slot_mapping] = v
        if layer == 0 and self.audit is not None:  # one ledger entry per slot, not per layer
            self.audit.record_writes(self.slot_mapping, self.writer_uids)
            self.audit.check_reads(self.uids, self.gather, self.key_valid)
        keys, values = k_cache[self.gather], v_cache[self.gather]  # (B, S, KVH, D)
        out = masked_attention(q[self.q_index], keys, values, self.mask)  # (B, T, H, D)
        return out.flatten(0, 1)[self.flat_rows]  # (N, H, D)


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
