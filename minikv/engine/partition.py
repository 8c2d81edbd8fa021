"""A static partition of a pool's pages among tenants (the `cache_partition` switch): each tenant
holds at most `quota = num_pages // tenants` pages, held or parked, and at its quota evicts only its
own. What a tenant observes of the pool is then a function of its own requests. See docs/engine.md.
"""

from collections import Counter


def quota_pages(pages: int, context_len: int, page_size: int, tenants: int) -> int:
    """A pool of `pages` pages that holds one context window, raised until each quota (cut for `tenants`)
    holds one too; one too small for a window stays as it is (the cluster's startup_check refuses it)."""
    window = -(-context_len // page_size)
    return max(pages, tenants * window) if pages >= window else pages


class TenantSlots:
    """The door's quota slots: taken by tenants in the order they first appear, never given back."""

    def __init__(self, tenants: int) -> None:
        self.tenants = tenants
        self.taken: set[str] = set()  # tenants holding a slot

    def take(self, tenant: str) -> str | None:
        """Give `tenant` a slot if it is new; why it is refused if every slot is another's, else None."""
        if tenant not in self.taken and len(self.taken) >= self.tenants:
            return (f"tenant {tenant!r} refused: the KV cache is partitioned for {self.tenants} "
                    f"tenant(s), every one of them taken")
        self.taken.add(tenant)
        return None


class Partition:
    """Which tenant each page of a pool is attributed to, and how many each one has against its quota."""

    def __init__(self, num_pages: int, tenants: int) -> None:
        assert tenants >= 1
        self.tenants, self.quota = tenants, num_pages // tenants
        assert self.quota * tenants <= num_pages, "the quotas add up to more than the pool"
        self.tenant_of: list[str | None] = [None] * num_pages  # page -> whose quota it counts in; None: free
        self.pages_of: Counter[str] = Counter()

    def room(self, tenant: str) -> int:
        """Pages `tenant` may still take off the common stack before it must evict its own."""
        return self.quota - self.pages_of[tenant]

    def attribute(self, page: int, tenant: str) -> None:
        """`page` (off the stack) now counts against `tenant`."""
        assert self.tenant_of[page] is None, f"page {page} is already {self.tenant_of[page]!r}'s"
        assert self.pages_of[tenant] < self.quota, f"{tenant!r} would pass its quota of {self.quota} pages"
        if tenant not in self.pages_of:
            assert len(self.pages_of) < self.tenants, f"more than {self.tenants} tenants in the pool"
        self.tenant_of[page] = tenant
        self.pages_of[tenant] += 1

    def release(self, page: int) -> None:
        """`page` goes back on the common stack: it counts against nobody."""
        tenant = self.tenant_of[page]
        assert tenant is not None, f"page {page} released but attributed to nobody"
        self.tenant_of[page] = None
        self.pages_of[tenant] -= 1

    def check(self, free_pages: list[int]) -> None:
        """Every page off the stack counts against one tenant, none on it; no tenant is above its quota."""
        stack = set(free_pages)
        for p, tenant in enumerate(self.tenant_of):
            assert (tenant is None) == (p in stack), f"page {p}: tenant {tenant}, on the stack {p in stack}"
        counted = Counter(t for t in self.tenant_of if t is not None)
        assert counted == +self.pages_of, "per-tenant page counts drifted"
        assert len(self.pages_of) <= self.tenants, f"more than {self.tenants} tenants in the pool"
        assert max(self.pages_of.values(), default=0) <= self.quota, f"a tenant passed {self.quota} pages"
