"""Checkers for the exercises of notebooks 02 (page pools) and 03 (admission control).

Each checker tries a learner's function on hidden cases and compares it with the engine's own
code: `PagePool.slots` for slot mapping, `memory.paged_use` for waste, and the admission
checks of admission.py for who gets in. It prints one line when everything passes and raises
AssertionError with a hint otherwise, so the exercise cell fails loudly until it is solved.
"""

from __future__ import annotations

import random
from typing import Callable

from minikv.admission import Rejected, check_context, check_pool
from minikv.memory import paged_use
from minikv.model import ModelConfig
from minikv.page_pool import PagePool

_TINY = ModelConfig(vocab_size=4, hidden_size=4, intermediate_size=4, num_layers=1, num_heads=1,
                    num_kv_heads=1, head_dim=2, max_position_embeddings=8)  # only the bookkeeping matters


def _block_tables(seed: int) -> list[tuple[list[int], int]]:
    """(block table, page size) pairs: scattered pages, page sizes from 1 token to 16."""
    rng = random.Random(seed)
    cases = [([0], 1), ([3, 0, 2], 4), ([41, 7, 19], 16)]
    for _ in range(5):
        page_size = rng.choice([2, 3, 8, 16])
        cases.append((rng.sample(range(64), rng.randint(1, 6)), page_size))
    return cases


def check_slot_mapping(fn: Callable[[list[int], int, int], int]) -> None:
    """fn(block_table, page_size, position) -> the pool slot holding that token's K/V."""
    count = 0
    for block_table, page_size in _block_tables(0):
        pool = PagePool(_TINY, num_pages=64, page_size=page_size)
        want = pool.slots(block_table, 0, len(block_table) * page_size)
        for position, slot in enumerate(want):
            got = fn(list(block_table), page_size, position)
            assert got == slot, (
                f"block table {block_table}, page size {page_size}, position {position}: got {got}, want {slot}. "
                "Find the entry of the block table that holds the position (which page), then the "
                "offset inside that page; a slot is page * page_size + offset.")
            count += 1
    print(f"correct on {count} token positions in 8 block tables")


_WASTE_CASES = [([1], 16), ([16], 16), ([17], 16), ([0, 5], 4), ([84, 150, 499, 512], 16),
                ([1, 2, 3, 4, 5, 6, 7, 8], 1), ([30] * 10, 32), ([100, 200, 300], 7)]


def check_wasted_slots(fn: Callable[[list[int], int], int]) -> None:
    """fn(kv_lens, page_size) -> slots a page pool reserves for these requests but leaves empty."""
    for kv_lens, page_size in _WASTE_CASES:
        use = paged_use(kv_lens, page_size)
        want = use.reserved_tokens - use.used_tokens
        got = fn(list(kv_lens), page_size)
        assert got == want, (
            f"K/V lengths {kv_lens}, page size {page_size}: got {got}, want {want}. Each request holds "
            "whole pages, enough for its tokens (round up); only the end of its last page stays empty.")
    print(f"correct on {len(_WASTE_CASES)} workloads")


def admitted(prompt_len: int, max_tokens: int, context_len: int, pool_pages: int, page_size: int) -> bool:
    """Whether a single-node engine admits the request: the engine's own checks, in its order."""
    try:
        check_context(prompt_len, max_tokens, context_len)
        need = -(-(prompt_len + max_tokens) // page_size) * page_size
        check_pool(need, pool_pages * page_size, "node", prompt_len)
    except Rejected:
        return False
    return True


_ADMISSION_CASES = [  # (prompt_len, max_tokens, context_len, pool_pages, page_size)
    (22, 48, 1024, 42, 16),  # an ordinary note
    (800, 48, 1024, 42, 16),  # the incident's bob, scaled by 1/1024: inside the window, beyond the pool
    (1023, 1, 1024, 125, 16),  # the longest prompt the window allows, on the post-fix pool
    (1024, 1, 1024, 125, 16),  # one token too long for the window
    (600, 500, 1024, 125, 16),  # prompt fits, prompt + output does not
    (624, 48, 1024, 42, 16),  # 672 tokens exactly: the whole pool
    (625, 48, 1024, 42, 16),  # one more token needs a 43rd page
    (10, 7, 4096, 3, 6),  # 17 tokens round up to 3 pages of 6 = 18 <= 18
    (12, 7, 4096, 3, 6),  # 19 tokens need 4 pages
]


def check_admission(fn: Callable[[int, int, int, int, int], bool]) -> None:
    """fn(prompt_len, max_tokens, context_len, pool_pages, page_size) -> True if the engine admits it."""
    for case in _ADMISSION_CASES:
        want, got = admitted(*case), fn(*case)
        prompt_len, max_tokens, context_len, pool_pages, page_size = case
        assert got == want, (
            f"prompt {prompt_len} tokens, max_tokens {max_tokens}, window {context_len}, pool {pool_pages} pages "
            f"x {page_size}: got {got}, want {want}. Two checks: prompt + output within the window (and the "
            "prompt at most window - 1), and prompt + output, rounded up to whole pages, within the pool.")
    print(f"correct on {len(_ADMISSION_CASES)} requests, the incident's included")


_STARTUP_CASES = [  # (pool_pages, page_size, context_len)
    (42, 16, 1024),  # the incident's prefill pool, scaled: 672 tokens
    (125, 16, 1024),  # the post-fix pool: 2,000 tokens
    (64, 16, 1024),  # exactly the window
    (4, 3, 20), (7, 3, 100), (1000, 8, 512),
]


def check_safe_context_len(fn: Callable[[int, int, int], int]) -> None:
    """fn(pool_pages, page_size, context_len) -> the largest window <= context_len the pool can always serve."""
    for pool_pages, page_size, context_len in _STARTUP_CASES:
        want = min(context_len, pool_pages * page_size)
        got = fn(pool_pages, page_size, context_len)
        assert got == want, (
            f"pool {pool_pages} pages x {page_size} tokens, configured window {context_len}: got {got}, want {want}. "
            "Read the pool size in tokens from the startup log; a window larger than that admits "
            "requests no node can hold, so lower it to the pool (never raise it).")
        for total in range(max(1, got - 2 * page_size), got + 1):  # every request the window allows fits
            assert admitted(total - 1, 1, got, pool_pages, page_size), f"window {got} admits {total} tokens"
    print(f"correct on {len(_STARTUP_CASES)} node configurations")
