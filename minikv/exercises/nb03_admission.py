"""Checkers for notebook 03 (continuous batching and admission control), against the admission
checks of engine/front_door.py."""

import random
from typing import Callable

from minikv.engine.front_door import Rejected, check_context, check_pool
from minikv.exercises import expect_cases


def admitted(prompt_len: int, max_tokens: int, context_len: int, pool_pages: int, page_size: int) -> bool:
    """Whether a single-node engine admits the request: the engine's own checks, in its order."""
    try:
        check_context(prompt_len, max_tokens, context_len)
        need = -(-(prompt_len + max_tokens) // page_size) * page_size
        check_pool(need, pool_pages * page_size, "node", prompt_len)
    except Rejected:
        return False
    return True


def largest_safe_window(pool_pages: int, page_size: int, context_len: int) -> int:
    """Search down from the configured window for the first whose largest request the engine admits."""
    return next(w for w in range(context_len, 0, -1) if admitted(w - 1, 1, w, pool_pages, page_size))


_rng = random.Random(3)
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
] + [(_rng.randint(1, 1100), _rng.randint(1, 200), 1024, _rng.randint(20, 90), _rng.choice([8, 16]))
      for _ in range(8)]
_STARTUP_CASES = [  # (pool_pages, page_size, context_len)
    (42, 16, 1024),  # the incident's prefill pool, scaled: 672 tokens
    (125, 16, 1024),  # the post-fix prefill pool: 2,000 tokens
    (64, 16, 1024),  # exactly the window
    (4, 3, 20), (7, 3, 100), (1000, 8, 512),
] + [(_rng.randint(2, 200), _rng.choice([4, 8, 16]), _rng.choice([256, 1024, 2048])) for _ in range(6)]


def check_admission(fn: Callable[[int, int, int, int, int], bool]) -> None:
    """fn(prompt_len, max_tokens, context_len, pool_pages, page_size) -> True if the engine admits it."""
    expect_cases(fn, admitted, _ADMISSION_CASES,
                 "prompt {} tokens, max_tokens {}, window {}, pool {} pages x {}",
                 "Go through the three rules of the notebook's 'A request that can never fit', in order.",
                 "correct on {} requests, the incident's included")


def check_safe_context_len(fn: Callable[[int, int, int], int]) -> None:
    """fn(pool_pages, page_size, context_len) -> the largest window <= context_len the pool always serves."""
    expect_cases(fn, largest_safe_window, _STARTUP_CASES, "pool {} pages x {} tokens, configured window {}",
                 "Read the pool size in tokens from the startup log; a window larger than that admits "
                 "requests no node can hold, so lower it to the pool (never raise it).",
                 "correct on {} node configurations")
