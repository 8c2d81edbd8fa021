"""Checkers for the notebooks' exercises: each tries a learner's function on hidden cases.

A checker prints one line saying what passed, and raises AssertionError with a hint when
something is wrong, so a cell that calls it fails loudly until the exercise is solved.
"""

from __future__ import annotations

from typing import Callable

from minikv.model import ModelConfig

_CONFIGS = [  # (layers, kv_heads, head_dim, bytes per value)
    (4, 4, 48, 4), (32, 8, 128, 2), (80, 8, 128, 2), (61, 1, 576, 2), (2, 3, 7, 1),
]


def check_kv_bytes_per_token(fn: Callable[[int, int, int, int], int]) -> None:
    """fn(num_layers, num_kv_heads, head_dim, bytes_per_value) -> bytes of K and V per token."""
    for layers, kv_heads, head_dim, nbytes in _CONFIGS:
        want = layers * 2 * kv_heads * head_dim * nbytes
        got = fn(layers, kv_heads, head_dim, nbytes)
        assert got == want, f"for {layers} layers, {kv_heads} kv heads, head_dim {head_dim}, {nbytes} bytes: got {got}, want {want} (remember K *and* V)"
    print(f"correct on {len(_CONFIGS)} model shapes")


def check_forward_tokens(fn: Callable[[int, int, bool], int]) -> None:
    """fn(prompt_len, new_tokens, use_cache) -> token positions pushed through the model."""
    cases = [(1, 1), (5, 3), (100, 20), (681, 1), (12, 50)]
    for prompt_len, new in cases:
        cached = prompt_len + (new - 1)  # the prompt once, then one token per further step
        uncached = sum(prompt_len + i for i in range(new))  # the whole sequence every step
        assert fn(prompt_len, new, True) == cached, f"with a cache, prompt {prompt_len}, {new} new tokens: want {cached}"
        assert fn(prompt_len, new, False) == uncached, f"without a cache, prompt {prompt_len}, {new} new tokens: want {uncached}"
    print(f"correct on {len(cases)} cases, with and without a cache")


def kv_bytes(config: ModelConfig, num_tokens: int, bytes_per_value: int = 4) -> int:
    """K/V bytes for `num_tokens` tokens of a model shaped like `config`."""
    return num_tokens * config.num_layers * 2 * config.num_kv_heads * config.head_dim * bytes_per_value
