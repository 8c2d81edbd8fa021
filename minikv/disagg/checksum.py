"""Adler-32 over KV bytes, computed where the KV lives (GPU or CPU), checked against its definition.

SGLang's `--disaggregation-enable-kv-checksum` has prefill compute an Adler-32 over the KV
pages it sends and decode recompute it over what arrived. Adler-32 is two running sums mod
65521 (RFC 1950): A = 1 + sum(bytes), B = sum of every prefix A, which vectorises as
B = n + sum((n-i) b_i). The weighted sum outgrows int64 past about 269 MB of 0xFF bytes, so the
tensor version works in blocks and reduces both sums mod 65521 after each, as zlib does every
NMAX = 5552 bytes to stay inside 32 bits.
"""

from __future__ import annotations

import zlib

import torch
from torch import Tensor

from minikv.engine.page_pool import PagePool

MOD_ADLER = 65521
INT64_MAX = 2**63 - 1
BLOCK_BYTES = 1 << 20  # 1 MiB a block: 255 * (2**20)**2 / 2 is 1.4e14, far inside int64, and 8 MiB temporaries stay in cache


def adler32(data: Tensor) -> int:
    """Adler-32 of the tensor's bytes: zlib on a CPU, tensor ops where the KV lives otherwise."""
    if data.device.type == "cpu":  # zlib reads the bytes in place, in one pass; the tensor ops copy them to int64
        return zlib.adler32(data.contiguous().view(torch.uint8).flatten().numpy())
    return adler32_on_device(data)


def adler32_on_device(data: Tensor, block_bytes: int = BLOCK_BYTES) -> int:
    """Adler-32 with tensor ops on the tensor's own device (the GPU path), no copy to the host.

    Each block of m bytes, entered with sums (a, b), leaves with a + S and b + m*a + W, where
    S = sum(bytes) and W = sum((m-j) b_j); both are reduced mod 65521 before the next block, so
    the size of the whole input never reaches the arithmetic, only `block_bytes` does.
    """
    assert 255 * block_bytes * (block_bytes + 1) // 2 + MOD_ADLER * (block_bytes + 1) < INT64_MAX, \
        f"block_bytes {block_bytes:,} would overflow int64"
    flat = data.contiguous().view(torch.uint8).flatten()  # (n,) bytes, no copy
    a, b = 1, 0
    for start in range(0, flat.numel(), block_bytes):
        block = flat[start : start + block_bytes].to(torch.int64)  # (m,) one block as int64
        m = block.numel()
        weights = torch.arange(m, 0, -1, device=block.device, dtype=torch.int64)  # (m,) m - j
        b = (b + m * a + int((weights * block).sum())) % MOD_ADLER
        a = (a + int(block.sum())) % MOD_ADLER
    return (b << 16) | a


def adler32_from_definition(data: bytes) -> int:
    """The slow, obvious version, from RFC 1950 and sharing no code with zlib: one byte at a time."""
    a, b = 1, 0
    for byte in data:
        a = (a + byte) % MOD_ADLER
        b = (b + a) % MOD_ADLER
    return (b << 16) | a


def tensor_bytes(data: Tensor) -> bytes:
    """The tensor's bytes in memory order, copied to the host."""
    return data.contiguous().cpu().view(torch.uint8).numpy().tobytes()


def kv_checksum(pool: PagePool, block_table: list[int], num_tokens: int) -> int:
    """Checksum of the K/V of a request's first `num_tokens` tokens, every layer.

    On a CPU, zlib runs over each page's bytes where they lie, chaining its running value from
    page to page, so nothing is gathered or copied; it equals `kv_checksum_reference`, which
    gathers the slots first (and is what runs on a GPU), and the tests check both against
    `adler32_from_definition` over the gathered bytes.
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


def gathered_kv(pool: PagePool, block_table: list[int], num_tokens: int) -> tuple[Tensor, Tensor]:
    """The K and V of a request's first `num_tokens` tokens, gathered in (layer, token) order."""
    slots = torch.tensor(pool.slots(block_table, 0, num_tokens), device=pool.kv.device)
    k, v = pool.flat_all()  # (L, num_slots, KVH, D) each
    return k[:, slots], v[:, slots]  # (L, num_tokens, KVH, D) each


def kv_checksum_reference(pool: PagePool, block_table: list[int], num_tokens: int) -> int:
    """The same checksum by gathering the request's slots into one tensor first."""
    k, v = gathered_kv(pool, block_table, num_tokens)
    return adler32(k) ^ adler32(v)  # bytes in (layer, token) order
