"""The mitigations, as switches. Each one changes a real code path; none is a special case.

| switch              | where it acts                               | closes                      |
| ------------------- | ------------------------------------------- | --------------------------- |
| reject_check        | queue gates on both roles ask "rejected?"   | over-length (the root bug)  |
| startup_check       | the cluster refuses to start if any pool    | over-length (the config)    |
|                     | is smaller than the context window          |                             |
| kv_checksum         | receiver verifies count and Adler-32 of KV  | over-length (detects)       |
| kv_canary           | reserved pages poisoned, checked before use | over-length (detects)       |
| deferred_release    | aborted pages wait for in-flight writes     | late-write                  |
| transfer_batch_cap  | large transfers split so none times out     | late-write                  |
| cache_salt          | prefix-cache keys salted with the tenant    | prefix-probe (cache hits)   |
| cache_partition     | a tenant's cached pages evicted only by it  | eviction-probe (LRU order)  |
| scrub_on_free       | freed pages are zeroed                      | hides the symptom only      |
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class SafetySwitches:
    """Which mitigations are on. The default is the safe preset."""

    reject_check: bool = True
    startup_check: bool = True
    kv_checksum: bool = True
    kv_canary: bool = True
    deferred_release: bool = True
    transfer_batch_cap: bool = True
    cache_salt: bool = True  # each tenant's prefix-cache pages are its own: no cross-tenant hits
    cache_partition: bool = True  # each tenant's parked pages evicted only by its own requests: no eviction channel
    scrub_on_free: bool = False  # costly, and it hides the bug rather than fixing it

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def preset(cls, name: str) -> "SafetySwitches":
        """'vulnerable': the engine before the fix, everything off. 'safe': the fixes on."""
        if name == "vulnerable":
            return cls(**{n: False for n in cls.names()})
        if name == "safe":
            return cls()
        raise ValueError(f"unknown preset {name!r}: choose 'vulnerable' or 'safe'")

    def with_switches(self, enable: list[str] = (), disable: list[str] = ()) -> "SafetySwitches":
        """A copy with some switches turned on or off; unknown names are an error."""
        known = set(self.names())
        for name in [*enable, *disable]:
            if name not in known:
                raise ValueError(f"unknown switch {name!r}: choose from {', '.join(self.names())}")
        changes = {n: True for n in enable} | {n: False for n in disable}
        return replace(self, **changes)

    def as_dict(self) -> dict[str, bool]:
        return {n: getattr(self, n) for n in self.names()}
