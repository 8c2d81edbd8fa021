"""Shared eviction order: does key B's own cache tell it what key A sent? (prime and probe; Osvik, Shamir and
Tromer 2006). Two variants, cache order and held pages (held_pages.py); docs/serve.md, "Prime and probe"."""

import math

from minikv.probe.held_pages import held_trial, trial_requests
from minikv.probe.report import FAIL, PASS, CheckResult, Incomplete
from minikv.probe.session import MARGIN_TOKENS, ProbeSession, served

MAX_TOKENS = 1
MAX_PROMPT_TOKENS = 2048  # B's prompts: the window's size up to this, so that a few fill a pool
A_SHARE = 1 / 4  # key A's prompts, of B's: two of them fit in B's oldest with room to spare
OVERFILL_SHARE = 1 / 4  # B primes this much past the measured pool (of one prompt), to be sure it is full
TRIALS_PER_KIND = 2  # of each variant
SEPARATION_SHARE = 1 / 2  # of A's prompt: the least gap between B's readings that counts as telling
VARIANTS = ("cache order", "held pages")


def check_eviction(s: ProbeSession, result: CheckResult) -> None:
    words = s.scale.words_for(min(s.context - MAX_TOKENS - MARGIN_TOKENS, MAX_PROMPT_TOKENS))
    a_words = s.scale.words_for(int(s.scale.tokens(words) * A_SHARE))
    held_a_words = words  # held pages: A's pages, not where they fall in an LRU, are what B reads
    measured = measure_pool(s, result, words)
    if measured is None:
        result.decide(PASS, "key B's own repeated prompt read no cached tokens: no prefix cache, so no eviction order")
        return
    pool, whole = measured
    primes = math.ceil(pool / s.scale.tokens(words) + OVERFILL_SHARE)
    readings = {v: {"repeat": [], "fresh": []} for v in VARIANTS}
    hidden = {v: {"repeat": [], "fresh": []} for v in VARIANTS}
    held: list[int] = []
    for number, (variant, kind) in enumerate(trial_order(s), 1):
        if variant == "cache order":
            reading, a_cached = trial(s, result, number, kind, words, a_words, pool)
        else:
            reading, a_cached, tokens = held_trial(s, result, number, kind, words, held_a_words, pool, whole, primes)
            held.append(tokens)
        readings[variant][kind].append(reading)
        hidden[variant][kind].append(a_cached)
    result.figures.update(pool_tokens=pool, b_prompt_tokens=s.scale.tokens(words),
                          a_prompt_tokens=s.scale.tokens(a_words), b_readings=readings["cache order"],
                          a_cached_tokens=hidden["cache order"],
                          held_pages={"a_prompt_tokens": s.scale.tokens(held_a_words), "hold_tokens": held,
                                      "b_survivors": readings["held pages"], "a_cached_tokens": hidden["held pages"]})
    decide(result, readings, hidden, {"cache order": s.scale.tokens(a_words), "held pages": s.scale.tokens(words)})


def trial_order(s: ProbeSession) -> list[tuple[str, str]]:
    """(variant, kind) of every trial: TRIALS_PER_KIND of each kind for each variant, in a random order."""
    trials = [(variant, kind) for variant in VARIANTS for kind in ("repeat", "fresh") for _ in range(TRIALS_PER_KIND)]
    s.rng.shuffle(trials)
    return trials


def measure_pool(s: ProbeSession, result: CheckResult, words: int) -> tuple[int, int] | None:
    """Key B's prompts until its least recently used one comes back short: (the tokens the pool keeps, what an
    untouched prompt reads). None when B's own repeated prompt reads no cached tokens: no cache, no order."""
    resident: list[str] = []  # B's prompts, least recently used first
    whole = None  # cached_tokens of a prompt nothing has evicted
    while True:
        trials = TRIALS_PER_KIND * 2 * (len(resident) + 5 + trial_requests(len(resident) + 1))
        if s.client.budget - s.client.sent < 2 + trials:
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
            return pool, whole


def trial(s: ProbeSession, result: CheckResult, number: int, kind: str, words: int, a_words: int,
          pool: int) -> tuple[int, int]:
    """Prime (B fills the pool), A's two prompts, probe (B re-sends its oldest): (B's reading, A's cached)."""
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
    result.note(f"cache order, trial {number}: key B primes ({len(prime)} prompts); key A sends a "
                f"{s.scale.tokens(a_words):,}-token prompt, then {what}; key B re-sends its oldest",
                f"key A's second: cached_tokens {second.cached_tokens}; key B's oldest: cached_tokens {reading:,}")
    return reading, second.cached_tokens or 0


def decide(result: CheckResult, readings: dict[str, dict[str, list[int]]], hidden: dict[str, dict[str, list[int]]],
           a_tokens: dict[str, int]) -> None:
    """FAIL if either variant tells A's repeat from A's fresh prompt in every trial; PASS if neither does;
    Incomplete if neither tells and one of them had nothing left to read. `a_tokens`: A's prompt in each."""
    told = {v: separates(readings[v], a_tokens[v]) for v in VARIANTS}
    result.figures["variants"] = {v: FAIL if told[v] else PASS for v in VARIANTS}
    shown = "; ".join(f"{v}: {shown_readings(v, readings[v], hidden[v])}" for v in VARIANTS)
    if any(told.values()):
        telling = " and ".join(v for v in VARIANTS if told[v])
        trials = TRIALS_PER_KIND * 2
        result.decide(FAIL, f"key A's requests move key B's own cache ({telling}: B tells whether A repeated itself "
                            f"in {trials} of {trials} trials): {shown}")
        return
    empty = [v for v in VARIANTS if max(readings[v]["repeat"] + readings[v]["fresh"]) == 0]
    if empty:
        raise Incomplete(f"key B's prompts were evicted whole in every trial of {' and '.join(empty)}: nothing left "
                         f"to read ({shown})")
    result.decide(PASS, f"what key A sends does not change key B's cache: {shown}")


def separates(readings: dict[str, list[int]], a_tokens: int) -> bool:
    """B's every reading after A's repeat above each after A's fresh prompt, by half of A's prompt."""
    return min(readings["repeat"]) - max(readings["fresh"]) >= SEPARATION_SHARE * a_tokens


def shown_readings(variant: str, readings: dict[str, list[int]], hidden: dict[str, list[int]]) -> str:
    what = "B's oldest prompt kept" if variant == "cache order" else "B's prompts kept, summed,"
    listed = {kind: ", ".join(map(str, values)) for kind, values in readings.items()}
    return (f"{what} {listed['repeat']} cached tokens after key A repeated a prompt (A's own hidden cached_tokens: "
            f"{', '.join(map(str, hidden['repeat']))}) and {listed['fresh']} after A sent two different ones")
