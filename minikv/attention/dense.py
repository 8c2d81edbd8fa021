"""Attention over a KV cache: the interface every cache implements, and the dense reference. The model
never owns its K/V: each layer hands them to a *backend* the caller chose. Three paths, one file each:
this one (a batch within itself under a mask), gather.py and tiles.py. See docs/engine.md.
"""

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


class AttentionBackend(Protocol):
    """Where one forward pass keeps and reads its keys and values."""

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, last_only: bool = False) -> Tensor:
        """Store decoder layer `layer`'s new `k`, `v` (..., KVH, D), then attend `q` (..., H, D; RoPE applied)
        over the visible cache; returns (..., H, D). With `last_only` (Llama.forward's last layer), q holds
        only each request's last new query (B, H, D); a backend that cannot asserts it is False."""
        ...


def repeat_kv(x: Tensor, num_heads: int) -> Tensor:
    """Grouped-query attention: each KV head repeated for its queries, (..., S, KVH, D) -> (..., S, H, D)."""
    num_kv_heads = x.shape[-2]
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    if num_kv_heads == num_heads:
        return x  # plain multi-head attention: repeat_interleave(1) would still copy every key
    return x.repeat_interleave(num_heads // num_kv_heads, dim=-2)


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool = False) -> Tensor:
    """Plain SDPA over gathered keys, the kernel every backend ends in: q (B, T, H, D), k, v (B, S, KVH, D),
    mask (B, T, S) True where a query may look, or None: every key (with `is_causal`, T == S: keys 0..t)."""
    assert not (is_causal and mask is not None), "a causal call takes no mask"
    num_heads = q.shape[-2]
    k, v = repeat_kv(k, num_heads), repeat_kv(v, num_heads)  # (B, S, H, D)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),  # (B, H, T|S, D)
        attn_mask=None if mask is None else mask.unsqueeze(1),  # (B, 1, T, S)
        is_causal=is_causal,
    )  # (B, H, T, D)
    return out.transpose(1, 2)


class DenseAttention:
    """No cache: a (B, T) batch attends within itself under an explicit mask (training, the reference)."""

    def __init__(self, mask: Tensor) -> None:
        assert mask.dim() == 3 and mask.dtype == torch.bool, mask.shape
        self.mask = mask  # (B, T, T)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, last_only: bool = False) -> Tensor:
        assert not last_only, "dense attention attends every query"
        return masked_attention(q, k, v, self.mask)


def causal_mask(batch: int, seq_len: int, device: torch.device | str = "cpu", start: int = 0) -> Tensor:
    """(B, T, S) mask of queries at positions start..S-1 over keys 0..S-1 (S = seq_len): t sees 0..t."""
    positions = torch.arange(seq_len, device=device)  # (S,)
    return (positions[None, :] <= positions[start:, None]).expand(batch, -1, -1)
