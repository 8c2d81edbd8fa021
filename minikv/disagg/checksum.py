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
    """Checksum of the K/V of a request's first `num_tokens` tokens, every layer.

    On a CPU, zlib runs over each page's bytes where they lie, chaining its running value from
    page to page, so nothing is gathered or copied; it equals `kv_checksum_reference`, which
    gathers the slots first (and is what runs on a GPU).
    """
    if pool.kv.device.type != "cpu":
        return kv_checksum_reference(pool, block_table, num_tokens)
    ps = pool.page_size
    kv = pool.kv.view(torch.uint8).numpy()  # (L, 2, P, page, KVH, D * itemsize) bytes, shared storage
    pages = block_table[: pool.pages_for(num_tokens)]
    sums = [1, 1]  # Adler-32 of no bytes, for K and V
    for layer in range(kv.shape[0]):
        for kind in (0, 1):
            for i, page in enumerate(pages):
                rows = min(ps, num_tokens - i * ps)  # the last page may be partly filled
                sums[kind] = zlib.adler32(kv[layer, kind, page, :rows], sums[kind])  # contiguous bytes
    return sums[0] ^ sums[1]


def kv_checksum_reference(pool: PagePool, block_table: list[int], num_tokens: int) -> int:
    """The same checksum by gathering the request's slots into one tensor first."""
    slots = torch.tensor(pool.slots(block_table, 0, num_tokens), device=pool.kv.device)
    k, v = pool.flat_all()  # (L, num_slots, KVH, D) each
    return adler32(k[:, slots]) ^ adler32(v[:, slots])  # bytes in (layer, token) order
