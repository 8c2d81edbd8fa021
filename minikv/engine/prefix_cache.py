"""The prefix cache: full pages keyed by a hash chained over everything before them (and the salt),
as vLLM's automatic prefix caching. It owns the keys, the index `key <-> page` and the parked pages
(held by nobody, still matchable, LRU first); the pool owns the ref counts. See docs/engine.md.
"""

import hashlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence

PageKey = bytes  # 16 bytes of BLAKE2b: the page's tokens and every page before it, and the salt


def cache_salt(tenant: str, request_salt: str | None, per_tenant: bool) -> str | None:
    """The namespace a request's pages are cached in (None: the one shared namespace). With `per_tenant`
    (the `cache_salt` switch) the tenant always goes in; a request's own salt narrows it further.
    Sequence.of, every door's one intake, is its only caller: no path drops the salt (SGLang #37160)."""
    parts = [f"tenant={tenant}"] if per_tenant else []
    parts += [] if request_salt is None else [f"salt={request_salt}"]
    return "\x00".join(parts) if parts else None


def page_keys(token_ids: Sequence[int], page_size: int, salt: str | None = None) -> list[PageKey]:
    """The key of each *full* page of `token_ids`: a hash chained over the prefix and the salt."""
    keys: list[PageKey] = []
    namespace = "salt:" + salt if salt is not None else "no salt"
    parent = hashlib.blake2b(namespace.encode(), digest_size=16).digest()
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(",".join(map(str, token_ids[start : start + page_size])).encode())
        parent = h.digest()
        keys.append(parent)
    return keys


def page_keys_reference(token_ids: Sequence[int], page_size: int, salt: str | None = None) -> list[PageKey]:
    """The slow, obvious version, for the tests: each key hashes the salt and the *whole* prefix up to
    its page's end. Other bytes than page_keys, the same equalities: equal keys exactly for equal prefixes."""
    return [hashlib.blake2b(repr((salt, tuple(token_ids[:end]))).encode(), digest_size=16).digest()
            for end in range(page_size, len(token_ids) + 1, page_size)]


class PrefixCache:
    """The index of cached pages, and the least-recently-used order of those nobody holds. Each parked
    page remembers its tenant, so that a partitioned pool (partition.py) evicts only a tenant's own."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.page_of: dict[PageKey, int] = {}
        self.key_of: dict[int, PageKey] = {}
        self.parked: OrderedDict[int, str] = OrderedDict()  # unheld, matchable: page -> tenant, LRU first

    def match(self, keys: Sequence[PageKey], num_tokens: int) -> list[int]:
        """The cached pages holding keys[0], keys[1], ... until one is missing: at most (num_tokens - 1)
        // page_size, since the last token is always computed (its logits choose the next token)."""
        pages = []
        for key in keys[: (num_tokens - 1) // self.page_size]:
            if (page := self.page_of.get(key)) is None:
                break
            pages.append(page)
        return pages

    def cache_pages(self, keys: Sequence[PageKey], block_table: list[int], num_computed: int) -> list[int]:
        """Key the full pages among the first `num_computed` tokens of a request; the pages newly named."""
        full = min(len(keys), num_computed // self.page_size)
        named = []
        for key, page in zip(keys[:full], block_table[:full]):
            if key not in self.page_of and page not in self.key_of:  # a name, once given, is kept
                self.page_of[key], self.key_of[page] = page, key
                named.append(page)
        return named

    def is_cached(self, page: int) -> bool:
        return page in self.key_of

    @property
    def num_parked(self) -> int:
        return len(self.parked)

    def _evictable_by(self, tenant: str | None) -> Iterator[int]:
        """Parked pages, oldest first, that a request of `tenant` may take for new data (None: anyone's)."""
        return (p for p, owner in self.parked.items() if tenant is None or owner == tenant)

    def evictable(self, tenant: str | None, keep: list[int] = ()) -> int:
        """How many parked pages a request of `tenant` may take for new data, those in `keep` aside."""
        kept = set(keep)
        return sum(1 for p in self._evictable_by(tenant) if p not in kept)

    def park(self, page: int, tenant: str) -> None:
        """Nobody holds `page` any more: keep it matchable, most recently used last."""
        assert page in self.key_of and page not in self.parked, f"page {page} parked twice or without a key"
        self.parked[page] = tenant

    def unpark(self, page: int) -> None:
        """A request hit a parked page: it is held again and cannot be evicted."""
        del self.parked[page]

    def evict(self, tenant: str | None) -> int:
        """Take the least recently used parked page `tenant` may evict out of the cache (None: anyone's)."""
        page = next(self._evictable_by(tenant))
        self.unpark(page)
        self.forget(page)
        return page

    def forget(self, page: int) -> None:
        """`page` no longer holds what its key says (evicted, or scrubbed): drop its name."""
        key = self.key_of.pop(page, None)
        if key is not None:
            del self.page_of[key]

    def check(self) -> None:
        """The index is one-to-one and every parked page is named."""
        assert len(self.page_of) == len(self.key_of), "key -> page and page -> key differ in size"
        for key, page in self.page_of.items():
            assert self.key_of.get(page) == key, f"page {page}: its key and the index disagree"
        for page in self.parked:
            assert page in self.key_of, f"parked page {page} has no key"
