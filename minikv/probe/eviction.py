"""Shared eviction order: does key B's own cache tell it what key A sent? (prime and probe; Osvik, Shamir and
Tromer 2006). Key B measures the pool, then in each trial fills it, A sends a prompt twice or two different ones,
and B re-sends its oldest: its own `cached_tokens` is higher after A repeated itself (docs/serve.md)."""

import math

from minikv.probe.report import FAIL, PASS, CheckResult, Incomplete
from minikv.probe.session import MARGIN_TOKENS, ProbeSession, served

MAX_TOKENS = 1
MAX_PROMPT_TOKENS = 2048  # B's prompts: the window's size up to this, so that a few fill a pool
A_SHARE = 1 / 4  # key A's prompts, of B's: two of them fit in B's oldest with room to spare
OVERFILL_SHARE = 1 / 4  # B primes this much past the measured pool (of one prompt), to be sure it is full
TRIALS_PER_KIND = 2
SEPARATION_SHARE = 1 / 2  # of A's prompt: the least gap between B's readings that counts as telling


def check_eviction(s: ProbeSession, result: CheckResult) -> None:
    words = s.scale.words_for(min(s.context - MAX_TOKENS - MARGIN_TOKENS, MAX_PROMPT_TOKENS))
    a_words = s.scale.words_for(int(s.scale.tokens(words) * A_SHARE))
    pool = measure_pool(s, result, words)
    if pool is None:
        result.decide(PASS, "key B's own repeated prompt read no cached tokens: no prefix cache, so no eviction order")
        return
    readings, hidden = {"repeat": [], "fresh": []}, {"repeat": [], "fresh": []}
    kinds = ["repeat", "fresh"] * TRIALS_PER_KIND
    s.rng.shuffle(kinds)
    for number, kind in enumerate(kinds, 1):
        reading, a_cached = trial(s, result, number, kind, words, a_words, pool)
        readings[kind].append(reading)
        hidden[kind].append(a_cached)
    result.figures.update(pool_tokens=pool, b_prompt_tokens=s.scale.tokens(words),
                          a_prompt_tokens=s.scale.tokens(a_words), b_readings=readings, a_cached_tokens=hidden)
    decide(result, readings, hidden, s.scale.tokens(a_words))


def measure_pool(s: ProbeSession, result: CheckResult, words: int) -> int | None:
    """Key B's prompts until its least recently used one comes back short: the tokens the pool keeps.
    None when B's own repeated prompt reads no cached tokens: there is no cache to share an order."""
    resident: list[str] = []  # B's prompts, least recently used first
    whole = None  # cached_tokens of a prompt nothing has evicted
    while True:
        if s.client.budget - s.client.sent < 2 + (TRIALS_PER_KIND * 2) * (len(resident) + 5):
            raise Incomplete(f"key B's {len(resident)} prompts ({len(resident) * (whole or 0):,} cached tokens) all "
                             "stayed cached: the pool holds more than this budget can fill and probe (--budget)")
        resident.append(s.words(words))
        served(s.client.complete(s.key_b, resident[-1], MAX_TOKENS))
        oldest = resident.pop(0)
        cached = served(s.client.complete(s.key_b, oldest, MAX_TOKENS)).cached_tokens
        resident.append(oldest)
        if cached is None:
            raise Incomplete("the endpoint does not report usage.prompt_tokens_details.cached_tokens, "
                             "which the eviction probe reads")
        whole = cached if whole is None else whole
        if whole == 0:
            return None
        if cached < whole:
            pool = (len(resident) - 1) * whole + cached
            result.note(f"key B: {len(resident)} prompts of {s.scale.tokens(words):,} tokens, re-sending its least "
                        f"recently used after each ({2 * len(resident)} requests)",
                        f"whole ones read {whole:,} cached tokens; after prompt {len(resident)} the oldest read "
                        f"{cached:,}: the pool keeps about {pool:,} tokens")
            return pool


def trial(s: ProbeSession, result: CheckResult, number: int, kind: str, words: int, a_words: int,
          pool: int) -> tuple[int, int]:
    """Prime (B fills the pool), A's two prompts, probe (B re-sends its oldest): (B's reading, A's cached_tokens)."""
    whole_tokens = s.scale.tokens(words)
    target = pool + OVERFILL_SHARE * whole_tokens
    prime = [s.words(words) for _ in range(math.floor(target / whole_tokens))]
    rest = target - len(prime) * whole_tokens
    if rest >= whole_tokens / 8:
        prime.append(s.words(s.scale.words_for(int(rest))))
    for prompt in prime:
        served(s.client.complete(s.key_b, prompt, MAX_TOKENS))
    first = s.words(a_words)
    served(s.client.complete(s.key_a, first, MAX_TOKENS))
    second = served(s.client.complete(s.key_a, first if kind == "repeat" else s.words(a_words), MAX_TOKENS))
    reading = served(s.client.complete(s.key_b, prime[0], MAX_TOKENS)).cached_tokens or 0
    what = "the same prompt again" if kind == "repeat" else "a different one"
    result.note(f"trial {number}: key B primes ({len(prime)} prompts); key A sends a {s.scale.tokens(a_words):,}-token "
                f"prompt, then {what}; key B re-sends its oldest",
                f"key A's second: cached_tokens {second.cached_tokens}; key B's oldest: cached_tokens {reading:,}")
    return reading, second.cached_tokens or 0


def decide(result: CheckResult, readings: dict[str, list[int]], hidden: dict[str, list[int]], a_tokens: int) -> None:
    after_repeat, after_fresh = readings["repeat"], readings["fresh"]
    if max(after_repeat + after_fresh) == 0:
        raise Incomplete("key B's oldest prompt was evicted whole in every trial: nothing left to read")
    shown = (f"key B's oldest prompt kept {', '.join(map(str, after_repeat))} cached tokens after key A repeated a "
             f"prompt (A's own hidden cached_tokens: {', '.join(map(str, hidden['repeat']))}) and "
             f"{', '.join(map(str, after_fresh))} after A sent two different ones")
    trials = len(after_repeat + after_fresh)
    if min(after_repeat) - max(after_fresh) >= SEPARATION_SHARE * a_tokens:
        result.decide(FAIL, f"the eviction order is shared across keys: {shown}; B tells whether A repeated itself "
                            f"in {trials} of {trials} trials")
    else:
        result.decide(PASS, f"what key A sends does not change key B's cache: {shown}")
