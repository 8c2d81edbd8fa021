"""The prefix cache: full pages keyed by a hash chained over everything before them.

K/V at position i depend only on tokens 0..i, so a request that starts as an earlier one did can
reuse that one's pages instead of computing them. As in vLLM's automatic prefix caching and
nano-vllm's block manager, only *full* pages are cached, and page i's key hashes page i-1's key and
page i's tokens: one key stands for the whole prefix. The first page's hash also takes the
request's **salt**: different salts never share a page (vLLM's `cache_salt`). With 1-token pages
the match goes token by token, like SGLang's radix tree. This file owns the keys, the index
`key <-> page`, and the pages nobody holds that stay matchable, least recently used first; the
pool owns the ref counts (page_pool.py).
"""


from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Sequence

PageKey = bytes  # 16 bytes of BLAKE2b: the page's tokens and every page before it, and the salt


def cache_salt(tenant: str, request_salt: str | None, per_tenant: bool) -> str | None:
    """The namespace a request's pages are cached in, or None for the one shared namespace.

    With `per_tenant` (the `cache_salt` safety switch) the tenant always goes in, so tenants
    never share pages; a request's own `cache_salt` narrows that further. Without it, only the
    request's own salt (if any) separates it from everyone else.
    """
    parts = ([f"tenant={tenant}"] if per_tenant else []) + ([f"salt={request_salt}"] if request_salt is not None else [])
    return "\x00".join(parts) if parts else None


def page_keys(token_ids: Sequence[int], page_size: int, salt: str | None = None) -> list[PageKey]:
    """The key of each *full* page of `token_ids`: a hash chained over the prefix and the salt."""
    keys: list[PageKey] = []
    parent = hashlib.blake2b(("salt:" + salt if salt is not None else "no salt").encode(), digest_size=16).digest()
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(",".join(map(str, token_ids[start : start + page_size])).encode())
        parent = h.digest()
        keys.append(parent)
    return keys


def request_page_keys(token_ids: Sequence[int], page_size: int, tenant: str, request_salt: str | None,
                      per_tenant: bool) -> list[PageKey]:
    """A request's page keys in its namespace: the one place a salt goes into the key.

    Every front door calls this (Engine, Cluster, DistCluster), so no path can drop the salt on
    the way (the bug class of SGLang #37160 and LMCache #4825: a salt lost at a boundary).
    """
    return page_keys(token_ids, page_size, cache_salt(tenant, request_salt, per_tenant))


def page_keys_reference(token_ids: Sequence[int], page_size: int, salt: str | None = None) -> list[PageKey]:
    """The slow, obvious version: each key hashes the salt and the *whole* prefix up to its page's end.

    Different bytes from page_keys (no chain), but the same equalities: two prefixes get equal
    keys exactly when they are equal. Used by tests to check the chain."""
    return [hashlib.blake2b(repr((salt, tuple(token_ids[:end]))).encode(), digest_size=16).digest()
            for end in range(page_size, len(token_ids) + 1, page_size)]


def tenant_share(pool_pages: int, context_pages: int, tenants: int) -> int:
    """Each tenant's share of a partitioned cache's parked pages: what is left once one whole context
    fits, cut in `tenants` (so a request never needs another tenant's cached page)."""
    return max(0, pool_pages - context_pages) // tenants


class PrefixCache:
    """The index of cached pages, and the least-recently-used order of those nobody holds.

    `tenant_pages` partitions the parked pages by tenant (the `cache_partition` switch): each tenant
    keeps at most that many, evicts only its own (its oldest, when it parks one too many), and a
    request takes only its own tenant's parked pages for new data. So no tenant's request ever
    evicts another's cached page, and B's `cached_tokens` cannot tell whether A's prompt hit its
    cache (prime and probe on a shared LRU can). None: one LRU for everyone, as vLLM and SGLang evict.
    """

    def __init__(self, page_size: int, tenant_pages: int | None = None) -> None:
        self.page_size, self.tenant_pages = page_size, tenant_pages
        self.page_of: dict[PageKey, int] = {}
        self.key_of: dict[int, PageKey] = {}
        self.parked: OrderedDict[int, str] = OrderedDict()  # ref count 0, still matchable: page -> tenant; oldest first
        self.parked_by: Counter[str] = Counter()
        self.hits = 0  # pages reused
        self.evictions = 0  # cached pages handed out for new data

    def match(self, keys: Sequence[PageKey], num_tokens: int) -> list[int]:
        """The cached pages holding the start of a `num_tokens`-token request whose full pages have
        `keys`: keys[0], keys[1], ... until one is missing.

        At most (num_tokens - 1) // page_size pages: the last token is always computed, since its
        logits choose the next token (and it must not be written into a shared page)."""
        pages = []
        for key in keys[: (num_tokens - 1) // self.page_size]:
            page = self.page_of.get(key)
            if page is None:
                break
            pages.append(page)
        return pages

    def insert(self, key: PageKey, page: int) -> bool:
        """Name `page` by `key`. False (and nothing changes) if the key or the page already has a name."""
        if key in self.page_of or page in self.key_of:
            return False
        self.page_of[key], self.key_of[page] = page, key
        return True

    def cache_pages(self, keys: Sequence[PageKey], block_table: list[int], num_computed: int) -> list[int]:
        """Name the full pages among a request's first `num_computed` tokens by their keys; the pages newly named."""
        full = min(len(keys), num_computed // self.page_size)
        return [p for key, p in zip(keys[:full], block_table[:full]) if self.insert(key, p)]

    def is_cached(self, page: int) -> bool:
        return page in self.key_of

    @property
    def num_parked(self) -> int:
        return len(self.parked)

    def evictable(self, tenant: str | None, keep: list[int] = ()) -> int:
        """Parked pages a request of `tenant` may take for new data, those in `keep` aside (None: anyone's)."""
        mine = lambda p: tenant is None or self.tenant_pages is None or self.parked[p] == tenant  # noqa: E731
        return sum(1 for p in self.parked if mine(p)) - sum(1 for p in set(keep) if p in self.parked and mine(p))

    def park(self, page: int, tenant: str) -> int | None:
        """Nobody holds `page` any more: keep it matchable, most recently used last. Returns the
        tenant's own oldest page, unnamed, when this one takes it past its share (None otherwise)."""
        assert page in self.key_of and page not in self.parked, f"page {page} parked twice or without a key"
        self.parked[page] = tenant
        self.parked_by[tenant] += 1
        if self.tenant_pages is not None and self.parked_by[tenant] > self.tenant_pages:
            return self.evict(tenant)
        return None

    def unpark(self, page: int) -> None:
        """A request hit a parked page: it is held again and cannot be evicted."""
        self.parked_by[self.parked.pop(page)] -= 1

    def evict(self, tenant: str | None) -> int:
        """Take the least recently used parked page `tenant` may evict out of the cache (None: anyone's)."""
        page = next(p for p, owner in self.parked.items() if tenant is None or self.tenant_pages is None or owner == tenant)
        self.unpark(page)
        self.forget(page)
        self.evictions += 1
        return page

    def forget(self, page: int) -> None:
        """`page` no longer holds what its key says (evicted, or scrubbed): drop its name."""
        key = self.key_of.pop(page, None)
        if key is not None:
            del self.page_of[key]

    def check(self) -> None:
        """The index is one-to-one, every parked page is named, and no tenant holds more than its share."""
        assert len(self.page_of) == len(self.key_of), "key -> page and page -> key differ in size"
        for key, page in self.page_of.items():
            assert self.key_of.get(page) == key, f"page {page}: its key and the index disagree"
        for page in self.parked:
            assert page in self.key_of, f"parked page {page} has no key"
        assert +self.parked_by == Counter(self.parked.values()), "parked counts disagree"
        if self.tenant_pages is not None:
            assert max(self.parked_by.values(), default=0) <= self.tenant_pages, f"a tenant parks more than {self.tenant_pages}"
