"""The mitigations, as switches. Each one changes a real code path; none is a special case.
Where each acts and what it closes: docs/disagg.md.
"""

from dataclasses import dataclass, fields, replace

from minikv.engine.config import CacheSwitches


@dataclass(frozen=True)
class PairSwitches:
    """The mitigations that act between the two nodes of the pair."""
    reject_check: bool = True  # the queue gates of both nodes also retire what intake marked for abort
    startup_check: bool = True  # the cluster refuses to start with a pool smaller than the context window
    kv_checksum: bool = True  # decode verifies the token count and Adler-32 of the KV that arrived
    kv_canary: bool = True  # decode poisons reserved pages; the poison must be gone before use
    deferred_release: bool = True  # an aborted request's pages wait until no write to them is in flight
    transfer_batch_cap: bool = True  # large transfers go in capped batches, so that none times out


@dataclass(frozen=True)
class SafetySwitches(CacheSwitches, PairSwitches):
    """Which mitigations are on: the pair's, then the cache's (engine/config.py). The default is the safe
    preset less `cache_partition`, off by default on every door; `preset("safe")` turns it on too."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def preset(cls, name: str) -> "SafetySwitches":
        """'vulnerable': the engine before the fix, everything off. 'safe': the fixes on."""
        if name == "vulnerable":
            return cls(**{n: False for n in cls.names()})
        if name == "safe":
            return cls(cache_partition=True)
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
