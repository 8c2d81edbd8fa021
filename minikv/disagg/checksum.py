"""Adler-32 over a request's KV, as SGLang's `--disaggregation-enable-kv-checksum`: prefill sums what
it sends, decode what arrived (zlib over the gathered slots; the definition: docs/disagg.md).
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
