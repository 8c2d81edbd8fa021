"""Adler-32 over KV bytes, computed where the KV lives (GPU or CPU), with zlib as the reference.

SGLang's `--disaggregation-enable-kv-checksum` has prefill compute an Adler-32 over the KV
pages it sends and decode recompute it over what arrived. Adler-32 is two running sums mod
65521: A = 1 + sum(bytes), B = sum of every prefix A, which vectorises as B = n + sum((n-i) b_i).
"""

from __future__ import annotations

import zlib

import torch
from torch import Tensor

from minikv.page_pool import PagePool

MOD_ADLER = 65521


def adler32(data: Tensor) -> int:
    """Adler-32 of the tensor's bytes: zlib on a CPU, tensor ops where the KV lives otherwise."""
    if data.device.type == "cpu":  # zlib reads the bytes in place, in one pass; the tensor ops copy them to int64
        return zlib.adler32(data.contiguous().view(torch.uint8).flatten().numpy())
    return adler32_on_device(data)


def adler32_on_device(data: Tensor) -> int:
    """Adler-32 with tensor ops on the tensor's own device (the GPU path), no copy to the host."""
    b = data.contiguous().view(torch.uint8).flatten().to(torch.int64)  # (n,) bytes
    n = b.numel()
    if n == 0:
        return 1
    weights = torch.arange(n, 0, -1, device=b.device, dtype=torch.int64)  # n - i
    a = (1 + int(b.sum())) % MOD_ADLER
    bsum = (n + int((weights * b).sum())) % MOD_ADLER  # fits int64 for n up to ~2e8 bytes
    return (bsum << 16) | a


def adler32_reference(data: Tensor) -> int:
    """The slow, obvious version: copy the bytes to the host and ask zlib."""
    return zlib.adler32(data.contiguous().cpu().view(torch.uint8).numpy().tobytes())


def kv_checksum(pool: PagePool, block_table: list[int], num_tokens: int) -> int:
    """Checksum of the K/V of a request's first `num_tokens` tokens, every layer."""
    slots = torch.tensor(pool.slots(block_table, 0, num_tokens), device=pool.kv.device)
    k, v = pool.flat_all()  # (L, num_slots, KVH, D) each
    return adler32(k[:, slots]) ^ adler32(v[:, slots])
