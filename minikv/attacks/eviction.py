"""Prime and probe: one shared least-recently-used list of parked pages lets tenants evict each other
across salts; `cache_partition` closes it. Front door only: runs on Engine and Cluster (docs/attacks.md)."""

import random

from minikv.attacks.workload import filler
from minikv.engine.front_door import FrontDoor


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
