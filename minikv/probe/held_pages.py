"""The eviction check's held-pages variant: after A's two prompts, key B holds pages with keyless decodes; how
many of B's own pages survive tells, if the free stack is shared, how many pages A parked (docs/serve.md)."""

import math
from concurrent.futures import ThreadPoolExecutor

from minikv.probe.report import CheckResult
from minikv.probe.session import MARGIN_TOKENS, ProbeSession, served

HOLDS = 4  # keyless decodes B sends at once
HOLD_SHARE = 1 / 2  # of B's measured pool: what the holds write in all, so that they evict some of B's pages
HOLD_PROMPT = "1 2 3 4"  # under a page; models go on counting (a random letter may end at once)


def trial_requests(prompts: int) -> int:
    """The most requests a trial sends when B's pool held `prompts` prompts: prime, A's two, holds, probe."""
    return 2 * (prompts + 1) + 2 + HOLDS


def held_trial(s: ProbeSession, result: CheckResult, number: int, kind: str, words: int, a_words: int,
               pool: int, whole: int, primes: int) -> tuple[int, int, int]:
    """Prime (`primes` of B's prompts, past its measured `pool`), A's two prompts, B's holds, probe (B's
    prompts newest first, up to the first that reads less than `whole`, what an untouched one reads):
    (B's cached tokens, summed; A's second prompt's cached_tokens; the tokens B's holds wrote)."""
    prime = [s.words(words) for _ in range(primes)]
    for prompt in prime:
        served(s.client.complete(s.key_b, prompt, 1))
    first = s.words(a_words)
    served(s.client.complete(s.key_a, first, 1))
    second = served(s.client.complete(s.key_a, first if kind == "repeat" else s.words(a_words), 1))
    held = hold(s, math.ceil(pool * HOLD_SHARE / HOLDS))
    readings = []
    for prompt in reversed(prime):
        readings.append(served(s.client.complete(s.key_b, prompt, 1)).cached_tokens or 0)
        if readings[-1] < whole:  # everything older is gone, and re-sending this one evicts more of it
            break
    what = "the same prompt again" if kind == "repeat" else "a different one"
    result.note(f"held pages, trial {number}: key B primes ({len(prime)} prompts); key A sends a "
                f"{s.scale.tokens(a_words):,}-token prompt, then {what}; key B holds {held:,} tokens with {HOLDS} "
                f"keyless decodes at once, then re-sends its prompts newest first",
                f"key A's second: cached_tokens {second.cached_tokens}; key B's prompts, newest first: cached_tokens "
                f"{', '.join(map(str, readings))} (sum {sum(readings):,})")
    return sum(readings), second.cached_tokens or 0, held


def hold(s: ProbeSession, tokens: int) -> int:
    """HOLDS decodes of key B at once, `tokens` out each (within the window): the tokens they wrote, as the
    endpoint counts them (fewer than asked where the model ended a reply early)."""
    max_tokens = max(1, min(tokens, s.context - s.scale.tokens(len(HOLD_PROMPT.split())) - MARGIN_TOKENS))
    with ThreadPoolExecutor(max_workers=HOLDS) as pool:
        replies = list(pool.map(lambda _: served(s.client.complete(s.key_b, HOLD_PROMPT, max_tokens)), range(HOLDS)))
    return sum(r.completion_tokens or 0 for r in replies)
