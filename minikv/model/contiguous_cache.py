"""The naive KV cache (notebook 01, and the benchmarks' baseline): every request reserves its own
row of `max_len` slots from its first token, whether it ends up using 20 of them or all of them.
Page pools (engine/page_pool.py) exist to stop that waste.
"""

import torch
from torch import Tensor

from minikv.attention.dense import masked_attention
from minikv.model.llama import ModelConfig


class ContiguousCache:
    """K/V for `num_rows` requests, each in its own row of `max_len` slots."""

    def __init__(self, config: ModelConfig, num_rows: int, max_len: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        shape = (config.num_layers, 2, num_rows, max_len, config.num_kv_heads, config.head_dim)
        self.kv = torch.zeros(shape, device=device, dtype=dtype)  # (L, 2, R, max_len, KVH, D)
        self.max_len = max_len
        self.seq_lens = [0] * num_rows  # tokens cached per row

    def step(self, rows: list[int], num_new: int) -> "ContiguousStep":
        """A backend for one forward that appends `num_new` tokens to each of `rows`."""
        for r in rows:
            if (n := self.seq_lens[r] + num_new) > self.max_len:
                raise ValueError(f"row {r} would hold {n} tokens > max_len {self.max_len}")
        return ContiguousStep(self, rows, num_new)

    def positions(self, rows: list[int], num_new: int) -> Tensor:
        """(B, T) positions of the next `num_new` tokens of each row."""
        starts = torch.tensor([self.seq_lens[r] for r in rows])
        return starts[:, None] + torch.arange(num_new)[None, :]


class ContiguousStep:
    """Implements AttentionBackend for one forward over some rows of a ContiguousCache."""

    def __init__(self, cache: ContiguousCache, rows: list[int], num_new: int) -> None:
        self.cache, self.rows, self.num_new = cache, rows, num_new
        device = cache.kv.device
        self.row_index = torch.tensor(rows, device=device)  # (B,)
        self.write_pos = cache.positions(rows, num_new).to(device)  # (B, T)
        self.span = max(cache.seq_lens[r] for r in rows) + num_new  # keys any row can see
        key_pos = torch.arange(self.span, device=device)  # (S,)
        self.mask = key_pos[None, None, :] <= self.write_pos[:, :, None]  # (B, T, S) causal per row

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        kv = self.cache.kv[layer]  # (2, R, max_len, KVH, D)
        rows = self.row_index[:, None].expand_as(self.write_pos)  # (B, T)
        kv[0, rows, self.write_pos] = k  # k: (B, T, KVH, D)
        kv[1, rows, self.write_pos] = v
        keys, values = kv[:, self.row_index, : self.span]  # (B, S, KVH, D) each
        return masked_attention(q, keys, values, self.mask)

    def commit(self) -> None:
        """After the forward: the new tokens now count as cached."""
        for r in self.rows:
            self.cache.seq_lens[r] += self.num_new
