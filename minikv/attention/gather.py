"""Attention request by request: each one's context gathered through its block table, then SDPA: no
padding, and a whole prompt takes SDPA's own causal case, at one launch per request. See docs/engine.md.
"""

import torch
from torch import Tensor

from minikv.attention.dense import causal_mask, masked_attention


def gather_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, context_slots: list[Tensor],
                     starts: list[int]) -> Tensor:
    """Request by request: gather its context (S_b,) slots from the (num_slots, KVH, D) caches, run SDPA.
    q (N, H, D) holds the requests' queries one after another, request b's at positions starts[b] .. S_b-1."""
    outs, offset = [], 0
    for slots, start in zip(context_slots, starts):
        end = slots.shape[0]
        num_new = end - start
        keys = k_cache.index_select(0, slots)[None]  # (1, S_b, KVH, D)
        values = v_cache.index_select(0, slots)[None]
        whole_prompt = start == 0 and num_new > 1  # SDPA's own causal case
        mask = causal_mask(1, end, q.device, start) if start > 0 and num_new > 1 else None  # (1, T_b, S_b)
        out = masked_attention(q[offset : offset + num_new][None], keys, values, mask, is_causal=whole_prompt)
        outs.append(out[0])  # (T_b, H, D)
        offset += num_new
    return torch.cat(outs)  # (N, H, D)
