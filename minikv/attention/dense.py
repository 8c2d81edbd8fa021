"""Attention over a KV cache: the interface every cache implements, and the dense reference.

The model never owns its keys and values: each layer hands its new K/V to a *backend* chosen by the
caller (a contiguous cache, a page pool, nothing at all), which stores them and attends the
queries over what each sequence may see. Three paths serve the engine, one file each: this one (a
batch attending within itself under a mask: training and the reference), gather.py (each request's
context gathered through its block table, then SDPA) and tiles.py (one call for a whole batch).
"""


from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


class AttentionBackend(Protocol):
    """Where one forward pass keeps and reads its keys and values."""

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, last_only: bool = False) -> Tensor:
        """Store this step's new `k`, `v` for `layer`, then attend `q` over the visible cache.

        Args:
            layer: index of the decoder layer calling.
            q: (..., num_heads, head_dim) queries of the new tokens, RoPE already applied; with
                `last_only`, only each request's last new token's query (B, H, D).
            k, v: (..., num_kv_heads, head_dim) keys and values of every new token.
            last_only: attend each request's last query only (Llama.forward's last layer, when
                only those rows' logits are kept); a backend that cannot asserts it is False.
        Returns:
            (..., num_heads, head_dim) attention output for each query given.
        """
        ...


def repeat_kv(x: Tensor, num_heads: int) -> Tensor:
    """Grouped-query attention: repeat each KV head for the query heads that share it.

    x: (..., S, num_kv_heads, D) -> (..., S, num_heads, D)
    """
    num_kv_heads = x.shape[-2]
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    if num_kv_heads == num_heads:
        return x  # plain multi-head attention: repeat_interleave(1) would still copy every key
    return x.repeat_interleave(num_heads // num_kv_heads, dim=-2)


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool = False) -> Tensor:
    """Plain SDPA over gathered keys: the one kernel every backend ends in.

    q: (B, T, H, D); k, v: (B, S, KVH, D); mask: (B, T, S) bool, True where a query may look,
    or None when every query may see every key, or (is_causal, mask None, T == S) query t sees
    keys 0..t. Returns (B, T, H, D).
    """
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
    """No cache at all: a (B, T) batch attends within itself under an explicit mask (training, the reference)."""

    def __init__(self, mask: Tensor) -> None:
        assert mask.dim() == 3 and mask.dtype == torch.bool, mask.shape
        self.mask = mask  # (B, T, T)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, last_only: bool = False) -> Tensor:
        assert not last_only, "dense attention attends every query"
        return masked_attention(q, k, v, self.mask)


def causal_mask(batch: int, seq_len: int, device: torch.device | str = "cpu") -> Tensor:
    """(B, T, T) lower-triangular mask: token t sees tokens 0..t."""
    tri = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    return tri.expand(batch, -1, -1)
