"""Checkers for notebook 04 (disaggregated prefill and decode).
"""

from __future__ import annotations

from typing import Callable


def check_decode_reservation(fn: Callable[[int, int, int], int]) -> None:
    """fn(prompt_tokens, max_tokens, page_size) -> pages the decode node preallocates."""
    cases = [(1, 1, 16), (16, 0 + 1, 16), (800, 48, 16), (24, 48, 16), (100, 28, 8), (5, 3, 2)]
    for prompt, out, ps in cases:
        want = -(-(prompt + out) // ps)
        got = fn(prompt, out, ps)
        assert got == want, f"prompt {prompt}, max_tokens {out}, page_size {ps}: got {got}, want {want} (prompt + output, rounded up to whole pages)"
    print(f"correct on {len(cases)} requests")


def check_transfer_ticks(fn: Callable[[int, int | None, int, int], int]) -> None:
    """fn(num_pages, cap, base_latency, pages_per_tick) -> ticks until the last batch lands."""
    cases = [(38, None, 1, 1), (38, 8, 1, 1), (1, None, 1, 1), (10, 4, 0, 2), (16, 16, 3, 1), (7, 3, 2, 2)]
    for pages, cap, base, rate in cases:
        size = cap or pages
        batches = [min(size, pages - i) for i in range(0, pages, size)]
        want = sum(base + -(-b // rate) for b in batches)  # one batch in flight at a time
        got = fn(pages, cap, base, rate)
        assert got == want, f"{pages} pages, cap {cap}, base {base}, {rate} pages/tick: got {got}, want {want}"
    print(f"correct on {len(cases)} transfers")
