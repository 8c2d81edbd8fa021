"""Prime and probe: the prefix cache's eviction order read as a side channel between tenants.

Per-tenant salts keep tenants' cache *keys* apart, but if every tenant's parked pages (cached,
held by no request) sit in one least-recently-used list, tenants still evict each other, as
processes do in a shared CPU cache (Osvik, Shamir and Tromer 2006). Bob **primes**: he fills the
pool with his own prompts. Alice sends a prompt, then either the same one again (a hit: almost no
new pages) or a fresh one (a miss: as many new pages again, evicting the oldest parked ones). Bob
**probes**: he re-sends his prompts and reads his own `cached_tokens`. Under the safe preset
(`cache_partition`) Alice's pages evict only Alice's, and Bob reads the same either way.

Only the front door (`generate`, `usage.cached_tokens`) is used: it runs on Engine and Cluster.
"""

from __future__ import annotations

import random

from minikv.engine.front_door import FrontDoor

ALPHABET = "abcdefghijklmnopqrstuvwxyz "


def filler(rng: random.Random, chars: int) -> str:
    """`chars` characters of random letters ending in a newline: a prompt no one else sends."""
    return "".join(rng.choice(ALPHABET) for _ in range(chars - 1)) + "\n"


def prime_and_probe(door: FrontDoor, a_repeats: bool, b_prompts: int = 7, chars: int = 496, seed: int = 0) -> list[int]:
    """Bob's cached_tokens for each of his prompts, re-sent after Alice's two (the second a repeat or fresh)."""
    rng = random.Random(seed)
    mine = [filler(rng, chars) for _ in range(b_prompts)]
    first, fresh = filler(rng, chars), filler(rng, chars)
    for prompt in mine:  # prime: Bob's pages parked in the pool, oldest first
        door.generate([prompt], max_tokens=1, tenant="bob")
    door.generate([first], max_tokens=1, tenant="alice")
    door.generate([first if a_repeats else fresh], max_tokens=1, tenant="alice")
    return [door.generate([prompt], max_tokens=1, tenant="bob")[0].usage.cached_tokens for prompt in mine]
