"""Checkers for notebook 01 (KV caching from first principles)."""

import random
from typing import Callable

import torch

from minikv.engine.page_pool import PagePool
from minikv.exercises import expect_cases
from minikv.model.llama import ModelConfig

DTYPES = {4: torch.float32, 2: torch.bfloat16, 1: torch.int8}  # bytes per value -> a dtype that size


def measured_kv_bytes(layers: int, kv_heads: int, head_dim: int, nbytes: int) -> int:
    """Bytes one token's slot really takes in a page pool of that model shape."""
    config = ModelConfig(vocab_size=2, hidden_size=kv_heads * head_dim, intermediate_size=2,
                         num_layers=layers, num_heads=kv_heads, num_kv_heads=kv_heads, head_dim=head_dim,
                         max_position_embeddings=2)
    return PagePool(config, num_pages=1, page_size=1, dtype=DTYPES[nbytes]).kv.nbytes


def check_kv_bytes_per_token(fn: Callable[[int, int, int, int], int]) -> None:
    """fn(num_layers, num_kv_heads, head_dim, bytes_per_value) -> bytes of K and V per token."""
    rng = random.Random(0)
    shapes = [(4, 4, 48, 4), (32, 8, 128, 2), (80, 8, 128, 2), (61, 1, 576, 2), (2, 3, 10, 1)]  # known ones
    shapes += [(rng.randint(1, 40), rng.randint(1, 16), rng.choice([8, 64, 96, 128]), rng.choice([1, 2, 4]))
               for _ in range(5)]
    expect_cases(fn, measured_kv_bytes, shapes, "{} layers, {} KV heads, head_dim {}, {} bytes per value",
                 "Each layer keeps a key AND a value vector per KV head.",
                 "correct on {} model shapes, measured on a real page pool")


def counted_attention_reads(prompt_len: int, new_tokens: int) -> int:
    """K/V vectors attention reads (per layer and head) generating with a cache, counted step by step."""
    reads, cached = 0, 0
    for fed in [prompt_len] + [1] * (new_tokens - 1):  # the prefill, then one token per decode step
        for _ in range(fed):  # causal: each new position reads every cached position and itself
            cached += 1
            reads += cached
    return reads


def check_attention_reads(fn: Callable[[int, int], int]) -> None:
    """fn(prompt_len, new_tokens) -> K/V vectors read by attention, per layer and head, with a cache."""
    rng = random.Random(1)
    cases = [(1, 1), (5, 3), (100, 20), (681, 1), (12, 50)]
    cases += [(rng.randint(1, 900), rng.randint(1, 64)) for _ in range(6)]
    expect_cases(fn, counted_attention_reads, cases, "prompt {} tokens, {} new tokens",
                 "Every position fed in (the prompt, then each new token but the last) reads itself and all "
                 "before it.",
                 "correct on {} requests")


def kv_bytes(config: ModelConfig, num_tokens: int, bytes_per_value: int = 4) -> int:
    """K/V bytes for `num_tokens` tokens of a model shaped like `config`."""
    return num_tokens * config.num_layers * 2 * config.num_kv_heads * config.head_dim * bytes_per_value
