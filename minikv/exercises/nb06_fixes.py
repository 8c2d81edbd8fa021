"""Checkers for notebook 06 (the fixes)."""

import random
import zlib
from typing import Callable
from unittest import mock

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
    cases += [(p, rng.choice([4, 8, 16]), rng.randint(1, p))
              for p in (rng.randint(20, 1000) for _ in range(7))]
    expect_cases(fn, counted_poisoned_pages, cases, "prompt {} tokens, pages of {}, {} token(s) transferred",
                 "Count the pages the prompt needs, and take away those the transfer wrote.",
                 "correct on {} transfers")


def check_adler32(fn: Callable[[bytes], int]) -> None:
    """fn(data) -> the Adler-32 of `data`, compared with zlib's, which `minikv/disagg/checksum.py` runs over
    every transferred page. The exercise asks for the definition, so `zlib.adler32` raises while fn runs."""
    rng = random.Random(32)
    cases = [(b"",), (b"a",), (b"Wikipedia",), (bytes(5552),), (b"\xff" * 6000,)]
    cases += [(rng.randbytes(rng.randint(1, 9000)),) for _ in range(6)]
    reference = zlib.adler32
    refusal = AssertionError("zlib.adler32 is the checker's reference: write the sum from its definition")
    with mock.patch("zlib.adler32", side_effect=refusal):
        expect_cases(fn, reference, cases, "{!r:.40}",
                     "A starts at 1 and adds each byte, B adds each new A; both mod 65521; "
                     "the sum is B * 65536 + A.", "correct on {} byte strings: the same sums as zlib")
