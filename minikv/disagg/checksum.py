"""Adler-32 over a request's KV, checked against its definition.

SGLang's `--disaggregation-enable-kv-checksum` has prefill compute an Adler-32 over the KV pages
it sends and decode recompute it over what arrived. Adler-32 (RFC 1950) is two running sums mod
65521: A = 1 + sum(bytes), B = sum of every prefix A. Here zlib computes it over the request's
slots, gathered from the pool in (layer, token) order and copied to the host (SGLang sums on the
GPU; a transfer over gloo stages the pages through host memory anyway).
"""

import zlib

import torch

from minikv.engine.page_pool import PagePool

MOD_ADLER = 65521


def adler32_from_definition(data: bytes) -> int:
    """The slow, obvious version, from RFC 1950 and sharing no code with zlib: one byte at a time."""
    a, b = 1, 0
    for byte in data:
        a = (a + byte) % MOD_ADLER
        b = (b + a) % MOD_ADLER
    return (b << 16) | a


def gathered_kv(pool: PagePool, block_table: list[int], num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V of a request's first `num_tokens` tokens, every layer: (L, num_tokens, KVH, D) each."""
    slots = torch.tensor(pool.slots(block_table, 0, num_tokens), device=pool.kv.device)
    k, v = pool.flat_all()  # (L, num_slots, KVH, D) each
    return k[:, slots], v[:, slots]


def kv_checksum(pool: PagePool, block_table: list[int], num_tokens: int) -> int:
    """Adler-32 of the K bytes xor Adler-32 of the V bytes of a request's first `num_tokens` tokens."""
    k, v = gathered_kv(pool, block_table, num_tokens)
    return zlib.adler32(k.cpu().numpy().tobytes()) ^ zlib.adler32(v.cpu().numpy().tobytes())
