"""Attention request by request: each one's context gathered through its block table, then SDPA.

The per-request path (attention/dense.py names all three). A batch whose requests hold 30 and 600
tokens gathers 630 keys, not 2 x 600 padded ones, and a whole prompt takes SDPA's own causal
case, which skips the hidden half instead of reading a mask; the price is one gather and one SDPA
launch per request per layer, which is why a GPU, or a large decode batch, takes the tiles instead.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minikv.attention.dense import masked_attention


def causal_mask_after(start: int, end: int, device: torch.device) -> Tensor | None:
    """(1, T, S) mask of queries start..end-1 over keys 0..end-1; None for a single query (it sees all)."""
    if end - start == 1:
        return None
    return (torch.arange(end, device=device)[None, :] <= torch.arange(start, end, device=device)[:, None])[None]


def gather_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, context_slots: list[Tensor],
                     starts: list[int]) -> Tensor:
    """Request by request: gather its context (S_b,) slots from the (num_slots, KVH, D) caches, run SDPA.

    q (N, H, D) holds the requests' queries one after another: request b's are positions
    starts[b] .. S_b - 1, each seeing keys 0 up to its own position.
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
