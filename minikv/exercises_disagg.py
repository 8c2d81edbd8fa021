"""Checkers for the exercises of notebooks 04-07 (disaggregated serving and the leak)."""

from __future__ import annotations

from typing import Callable

from minikv.response import Response, Usage


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


def check_output_test(fn: Callable[[str, Response], bool]) -> None:
    """fn(prompt, response) -> True when the response is trustworthy for that prompt.

    A good test looks at the text, not only the status: a 200 whose reply repeats a note that
    the prompt never contained is a leak; a 400 or 500 is an honest failure, not a leak.
    """
    ok = lambda text: Response("r", "bob", 200, text, Usage(30, len(text)))  # noqa: E731
    cases = [
        ("alice: save pin 0912.\n", ok("saved pin 0912."), True),
        ("bob: read the report.\n", ok("saved nothing."), True),
        ("bob: read the report.\n", ok("saved card 4111 2222 3333 4444."), False),
        ("dave: save pin 4821.\n", ok("saved key sk-live-7Hq2Zp9Xw4."), False),
        ("bob: read the report.\n", Response("r", "bob", 400, "", Usage(30, 0), error="too long"), True),
        ("carol: save key abc.\n", ok("saved key abd."), False),
    ]
    for prompt, response, trustworthy in cases:
        got = fn(prompt, response)
        assert got == trustworthy, (f"prompt {prompt!r}, status {response.status}, text {response.text!r}: "
                                    f"returned {got}, want {trustworthy}")
    print(f"correct on {len(cases)} responses: this test checks outputs, not just status codes")


def check_largest_safe_cap(fn: Callable[[int, int, int], int]) -> None:
    """fn(base_latency, pages_per_tick, timeout_ticks) -> the largest batch (in pages) that lands
    before the receiver's timeout fires (a batch must land within timeout_ticks ticks)."""
    cases = [(1, 1, 16), (0, 1, 16), (1, 2, 16), (3, 1, 4), (2, 4, 10)]
    for base, rate, timeout in cases:
        want = max(n for n in range(1, 10_000) if base + -(-n // rate) <= timeout)
        got = fn(base, rate, timeout)
        assert got == want, f"base {base}, {rate} pages/tick, timeout {timeout}: got {got}, want {want}"
    print(f"correct on {len(cases)} fabrics")
