"""Shared eviction order: does key B's own cache tell it what key A sent? (prime and probe)

A salt per tenant keeps the cache *keys* apart, but if the cached pages nobody holds sit in one
least-recently-used list, tenants still evict each other, as processes do in a shared CPU cache
(prime and probe, Osvik, Shamir and Tromer 2006). Key B primes: it fills the pool with its own
prompts. Key A sends a prompt, then either the same prompt again (a hit: it needs almost no new
pages) or a different one (a miss: as many new pages again). Key B probes: it re-sends its oldest
prompt and reads its own `usage.prompt_tokens_details.cached_tokens`. Engines evict a prompt's
last pages first, so B's reading falls by what A's requests took: it is higher by about A's hidden
cached_tokens when A repeated itself. Same trials, both kinds in a random order; if every reading
after a repeat beats every reading after a miss by half of A's prompt or more, B can tell: FAIL.

The probe does not know the pool's size, so it measures it from B's side first: B sends prompts
one at a time, re-sending its least recently used after each, until that one stops hitting whole.
"""

from __future__ import annotations

import math
from http import HTTPStatus

from minikv.probe.replies import Observation
from minikv.probe.report import FAIL, INCOMPLETE, PASS, CheckResult
from minikv.probe.session import MARGIN_TOKENS, ProbeSession

MAX_TOKENS = 1
MAX_PROMPT_TOKENS = 2048  # B's prompts: the window's size up to this, so that a few fill a pool
A_SHARE = 1 / 4  # key A's prompts, of B's: two of them fit in B's oldest with room to spare
OVERFILL_SHARE = 1 / 4  # B primes this much past the measured pool (of one prompt), to be sure it is full
TRIALS_PER_KIND = 2
SEPARATION_SHARE = 1 / 2  # of A's prompt: the least gap between B's readings that counts as telling


class Unserved(Exception):
    """A request of the check was not answered 200: the check cannot finish."""


def check_eviction(s: ProbeSession, result: CheckResult) -> None:
    words = s.scale.words_for(min(s.context - MAX_TOKENS - MARGIN_TOKENS, MAX_PROMPT_TOKENS))
    a_words = s.scale.words_for(int(s.scale.tokens(words) * A_SHARE))
    try:
        pool = measure_pool(s, result, words)
        if pool is None:
            return
        readings, hidden = {"repeat": [], "fresh": []}, {"repeat": [], "fresh": []}
        kinds = ["repeat", "fresh"] * TRIALS_PER_KIND
        s.rng.shuffle(kinds)
        for i, kind in enumerate(kinds):
            reading, a_cached = trial(s, result, i + 1, kind, words, a_words, pool)
            readings[kind].append(reading)
            hidden[kind].append(a_cached)
    except Unserved as e:
        result.decide(INCOMPLETE, str(e))
        return
    result.figures.update(pool_tokens=pool, b_prompt_tokens=s.scale.tokens(words), a_prompt_tokens=s.scale.tokens(a_words),
                          b_readings=readings, a_cached_tokens=hidden)
    decide(result, readings, hidden, s.scale.tokens(a_words))


def measure_pool(s: ProbeSession, result: CheckResult, words: int) -> int | None:
    """Key B's prompts until its least recently used one comes back short: the tokens the pool keeps.

    None (and the result decided) when there is no cache to read or the budget cannot fill it.
    """
    resident: list[str] = []  # B's prompts, least recently used first
    whole = None  # cached_tokens of a prompt nothing has evicted
    while True:
        left = s.client.budget - s.client.sent
        if left < 2 + (TRIALS_PER_KIND * 2) * (len(resident) + 5):
            result.decide(INCOMPLETE, f"key B's {len(resident)} prompts ({len(resident) * (whole or 0):,} cached tokens) all "
                                      "stayed cached: the pool holds more than this budget can fill and probe (--budget)")
            return None
        resident.append(s.words(words))
        served(s.client.complete(s.key_b, resident[-1], MAX_TOKENS))
        oldest = resident.pop(0)
        cached = served(s.client.complete(s.key_b, oldest, MAX_TOKENS)).cached_tokens
        resident.append(oldest)
        if cached is None:
            result.decide(INCOMPLETE, "the endpoint does not report usage.prompt_tokens_details.cached_tokens, "
                                      "which the eviction probe reads")
            return None
        whole = cached if whole is None else whole
        if whole == 0:
            result.decide(PASS, "key B's own repeated prompt read no cached tokens: no prefix cache, so no eviction order")
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
    shown = (f"key B's oldest prompt kept {', '.join(map(str, after_repeat))} cached tokens after key A repeated a prompt "
             f"(A's own hidden cached_tokens: {', '.join(map(str, hidden['repeat']))}) and "
             f"{', '.join(map(str, after_fresh))} after A sent two different ones")
    gap = min(after_repeat) - max(after_fresh)
    if max(after_repeat + after_fresh) == 0:
        result.decide(INCOMPLETE, "key B's oldest prompt was evicted whole in every trial: nothing left to read")
    elif gap >= SEPARATION_SHARE * a_tokens:
        result.decide(FAIL, f"the eviction order is shared across keys: {shown}; B tells whether A repeated itself "
                            f"in {len(after_repeat + after_fresh)} of {len(after_repeat + after_fresh)} trials")
    else:
        result.decide(PASS, f"what key A sends does not change key B's cache: {shown}")


def served(obs: Observation) -> Observation:
    if obs.status != HTTPStatus.OK:
        raise Unserved(f"a request of the eviction probe was not served ({obs.summary()})")
    return obs
