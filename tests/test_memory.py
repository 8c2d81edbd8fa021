"""KV memory accounting: what a contiguous reservation and a page pool hold for the same requests."""

from __future__ import annotations

import pytest

from minikv.bench.memory import KVMemoryUse, contiguous_use, paged_use


def test_contiguous_reserves_the_whole_row_per_request():
    """Every request holds max_len slots, however few it fills."""
    use = contiguous_use([100, 300], 1024)
    assert (use.used_tokens, use.reserved_tokens, use.num_requests) == (400, 2048, 2)
    assert use.utilisation == pytest.approx(400 / 2048)


def test_contiguous_accepts_one_row_size_per_request():
    """prompt + max_tokens rows: each request reserves its own size."""
    use = contiguous_use([10, 20], [15, 20], scheme="prompt + max_tokens")
    assert use.reserved_tokens == 35 and use.scheme == "prompt + max_tokens"


def test_paged_reserves_whole_pages_only():
    """Pages round each request up to a multiple of the page size, no more."""
    use = paged_use([1, 16, 17, 0], 16)
    assert use.reserved_tokens == 16 + 16 + 32 + 0
    assert use.used_tokens == 34


def test_paged_waste_is_under_one_page_per_request():
    """Whatever the lengths, a page pool leaves fewer than page_size empty slots per request."""
    lens = [3, 84, 150, 499, 512, 1000]
    use = paged_use(lens, 16)
    assert 0 <= use.reserved_tokens - use.used_tokens < 16 * len(lens)


def test_waste_and_utilisation_add_up_and_print():
    """waste = 1 - utilisation, and the summary names both numbers."""
    use = KVMemoryUse("x", 1, 25, 100)
    assert use.waste == pytest.approx(0.75)
    assert str(use) == "x: 100 slots reserved for 25 tokens (25.0% used, 75.0% wasted)"


def test_nothing_reserved_wastes_nothing():
    """No requests: utilisation 1, waste 0 (no division by zero)."""
    assert paged_use([], 16).waste == 0.0


def test_bad_lengths_are_refused_with_the_numbers():
    """A request longer than its row, a negative length or a bad page size fails loudly."""
    with pytest.raises(ValueError, match="filled 20 slots, more than its row of 16"):
        contiguous_use([20], 16)
    with pytest.raises(ValueError, match="-1"):
        paged_use([-1], 16)
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        paged_use([4], 0)
    with pytest.raises(ValueError, match="2 K/V lengths but 1 row sizes"):
        contiguous_use([1, 2], [4])
