"""Checkers for notebook 09 (shared prefixes), against the page pool's own prefix lookup: for cached
tokens, and in a cache filled by a victim's prompt for the attack."""

import random
from collections.abc import Callable

from minikv.attacks.workload import SECRET_ALPHABET
from minikv.engine.page_pool import PagePool
from minikv.engine.prefix_cache import page_keys
from minikv.exercises import TINY_MODEL, expect_cases


def cached_tokens(earlier: list[list[int]], prompt: list[int], page_size: int) -> int:
    """What the engine reports: earlier prompts' full pages are cached; `prompt` reuses the leading ones."""
    num_pages = sum(len(p) // page_size + 1 for p in earlier) + 1
    pool = PagePool(TINY_MODEL, num_pages, page_size, prefix_caching=True)
    for i, ids in enumerate(earlier):
        pages = pool.allocate(pool.pages_for(len(ids)), f"r{i}")
        pool.prefix_cache.cache_pages(page_keys(ids, page_size), pages, len(ids))
        pool.free(pages, f"r{i}")
    return len(pool.prefix_cache.match(page_keys(prompt, page_size), len(prompt))) * page_size


def check_cached_tokens(fn: Callable[[list[list[int]], list[int], int], int]) -> None:
    """fn(earlier_prompts, prompt, page_size) -> how many of prompt's tokens come from the cache."""
    rng = random.Random(9)
    cases = [([[1, 2, 3, 4]], [1, 2, 3, 4], 1), ([[1, 2, 3, 4]], [1, 2, 3, 4], 2), ([[5, 6]], [1, 2, 3], 1)]
    for _ in range(40):
        stem = [rng.randrange(3) for _ in range(rng.randint(0, 12))]
        earlier = [stem + [rng.randrange(3) for _ in range(rng.randint(0, 6))]
                   for _ in range(rng.randint(1, 3))]
        prompt = stem[: rng.randint(0, len(stem))] + [rng.randrange(3) for _ in range(rng.randint(1, 8))]
        cases.append((earlier, prompt, rng.choice([1, 2, 3, 4])))
    expect_cases(fn, cached_tokens, cases, "earlier prompts {}, prompt {}, page size {}",
                 "Only full pages are cached, and a page counts only if every page before it matches too; "
                 "which of the prompt's tokens does the engine always compute itself?", "correct on {} cases")


def check_recover(fn: Callable[[Callable[[str], int], str, str], str]) -> None:
    """fn(cached_tokens_of, known, alphabet) -> the secret that follows `known` in the cached prompt;
    `cached_tokens_of(prompt)` answers as the engine's usage would, at 1-token pages, for a cache holding one
    victim prompt: `known + secret + ".\\n"`."""
    rng = random.Random(13)
    secrets = ["a", "0912", "Zz-9"] + ["".join(rng.choice(SECRET_ALPHABET) for _ in range(rng.randint(1, 12)))
                                      for _ in range(6)]
    for secret in secrets:
        known = rng.choice(["alice: save key ", "bob: save pin ", "carol: save card "])
        victim = [ord(c) for c in known + secret + ".\n"]
        calls = []

        def oracle(prompt: str) -> int:
            calls.append(prompt)
            return cached_tokens([victim], [ord(c) for c in prompt], 1)

        got = fn(oracle, known, SECRET_ALPHABET)
        assert got == secret, (
            f"expected {secret!r} (the victim sent {known + secret!r} then '.'), got {got!r}. One character "
            "at a time: how far can a probe's cached_tokens reach when its guess is right, and when it is "
            "wrong? Remember the token the engine always computes.")
        most = (len(secret) + 1) * (len(SECRET_ALPHABET) + 1)
        assert len(calls) <= most, \
            f"expected at most {most} probes (one per candidate per character), got {len(calls)}"
    print(f"recovered {len(secrets)} secrets exactly")
