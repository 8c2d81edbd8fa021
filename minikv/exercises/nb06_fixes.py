"""Checkers for notebook 06 (the fixes)."""

import random
from typing import Callable

from minikv.exercises import expect_cases


def counted_poisoned_pages(prompt_tokens: int, page_size: int, tokens_transferred: int) -> int:
    """Prompt pages that no transferred token landed in, counted page by page."""
    prompt_pages = {position // page_size for position in range(prompt_tokens)}
    landed = {position // page_size for position in range(tokens_transferred)}  # whole pages are written
    return len(prompt_pages - landed)


def check_poisoned_pages(fn: Callable[[int, int, int], int]) -> None:
    """fn(prompt_tokens, page_size, tokens_transferred) -> reserved prompt pages still holding the canary."""
    rng = random.Random(6)
    cases = [(800, 16, 800), (16, 16, 1), (17, 16, 1), (100, 8, 30), (1, 4, 1)]
    cases += [(p, rng.choice([4, 8, 16]), rng.randint(1, p)) for p in (rng.randint(20, 1000) for _ in range(7))]
    expect_cases(fn, counted_poisoned_pages, cases, "prompt {} tokens, pages of {}, {} token(s) transferred",
                 "Count the pages the prompt needs, and take away those the transfer wrote.", "correct on {} transfers")
