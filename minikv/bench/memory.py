"""How much reserved KV memory holds real tokens: a contiguous row of `max_len` slots held for the whole
request, against a page pool whose only empty slots are the end of each last page (notebook 02)."""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KVMemoryUse:
    """Slots a set of requests filled with K/V (`used_tokens`) out of the slots reserved for them."""

    scheme: str
    num_requests: int
    used_tokens: int
    reserved_tokens: int

    @property
    def utilisation(self) -> float:
        """Share of the reserved slots that hold a token's K/V (1.0 when nothing is reserved)."""
        return self.used_tokens / self.reserved_tokens if self.reserved_tokens else 1.0

    @property
    def waste(self) -> float:
        return 1.0 - self.utilisation

    def __str__(self) -> str:
        return (f"{self.scheme}: {self.reserved_tokens:,} slots reserved for {self.used_tokens:,} tokens "
                f"({self.utilisation:.1%} used, {self.waste:.1%} wasted)")


def _check_lengths(kv_lens: Sequence[int]) -> None:
    for n in kv_lens:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"every K/V length must be a whole number of tokens >= 0, got {n!r}")


def contiguous_use(kv_lens: Sequence[int], max_lens: int | Sequence[int], scheme: str = "contiguous") -> KVMemoryUse:
    """`kv_lens`: the slots each request filled; `max_lens`: each one's row (one size for all, or each's)."""
    _check_lengths(kv_lens)
    rows = [max_lens] * len(kv_lens) if isinstance(max_lens, int) else list(max_lens)
    if len(rows) != len(kv_lens):
        raise ValueError(f"{len(kv_lens)} K/V lengths but {len(rows)} row sizes")
    for i, (n, row) in enumerate(zip(kv_lens, rows)):
        if n > row:
            raise ValueError(f"request {i} filled {n} slots, more than its row of {row}")
    return KVMemoryUse(scheme, len(kv_lens), sum(kv_lens), sum(rows))


def paged_use(kv_lens: Sequence[int], page_size: int, scheme: str = "paged") -> KVMemoryUse:
    """Each request holds ceil(len / page_size) whole pages: only its last page can be part empty."""
    _check_lengths(kv_lens)
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    return KVMemoryUse(scheme, len(kv_lens), sum(kv_lens), sum(-(-n // page_size) for n in kv_lens) * page_size)
