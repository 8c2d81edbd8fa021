"""Prime and probe on the page pool: Bob fills the pool (or his share) with his own cached prompts, Alice
sends a prompt and then repeats it (a hit: no new pages) or sends a fresh one (a miss: new pages), and Bob
re-sends his prompts and reads his own `cached_tokens`. Two variants: the *cache order* (Alice's miss
evicts Bob's oldest pages on one shared LRU) and *held pages* (Bob then holds pages with keyless decodes,
and how many of his own pages they evict tells how many pages everyone else holds or parked: a shared free
stack). The static partition (`cache_partition`, engine/partition.py) closes both. Front door only: runs
on Engine and Cluster (docs/attacks.md)."""

import random
import string

from minikv.attacks.workload import filler
from minikv.engine.front_door import FrontDoor


def prime_and_probe(door: FrontDoor, a_repeats: bool, b_prompts: int = 7, chars: int = 496,
                    seed: int = 0) -> list[int]:
    """Cache order: Bob's cached_tokens for each of his prompts, re-sent after Alice's two (same or fresh)."""
    rng = random.Random(seed)
    mine = prime(door, rng, b_prompts, chars)
    alice_twice(door, rng, chars, a_repeats)
    return probe(door, mine)


def held_pages(door: FrontDoor, a_repeats: bool, b_prompts: int = 3, chars: int = 496, holds: int = 4,
               hold_tokens: int = 256, seed: int = 0) -> list[int]:
    """Held pages: after Alice's two prompts Bob runs `holds` keyless decodes at once (prompts under a page,
    `hold_tokens` tokens out each), then re-sends his prompts newest first: his cached_tokens for each."""
    rng = random.Random(seed)
    mine = prime(door, rng, b_prompts, chars)
    alice_twice(door, rng, chars, a_repeats)
    door.generate(hold_prompts(rng, holds), max_tokens=hold_tokens, tenant="bob")
    return probe(door, mine[::-1])


def hold_prompts(rng: random.Random, holds: int) -> list[str]:
    """Prompts that hold pages without caching any: one letter each, under a page (no full page, so no
    cache key), and no end of line, so that the model writes on to max_tokens."""
    return [rng.choice(string.ascii_lowercase) for _ in range(holds)]


def prime(door: FrontDoor, rng: random.Random, b_prompts: int, chars: int) -> list[str]:
    """Bob's prompts, sent one by one: his pages parked in the pool, oldest first."""
    mine = [filler(rng, chars) for _ in range(b_prompts)]
    for prompt in mine:
        door.generate([prompt], max_tokens=1, tenant="bob")
    return mine


def alice_twice(door: FrontDoor, rng: random.Random, chars: int, repeats: bool) -> None:
    """Alice's prompt, then the same one again (a cache hit) or a fresh one (a miss). Both are drawn either
    way, so that Bob's own prompts are the same in both runs."""
    first, fresh = filler(rng, chars), filler(rng, chars)
    door.generate([first], max_tokens=1, tenant="alice")
    door.generate([first if repeats else fresh], max_tokens=1, tenant="alice")


def probe(door: FrontDoor, prompts: list[str]) -> list[int]:
    """Bob re-sends `prompts` in this order: the cached_tokens each one reads."""
    return [door.generate([prompt], max_tokens=1, tenant="bob")[0].usage.cached_tokens for prompt in prompts]
