"""Canary: a random string key A saves (the shipped model repeats notes) must never come back to key B's
prompts of 3/4 of the window to past it, those that reached freed pages in the incident (docs/serve.md)."""

import string
from http import HTTPStatus

from minikv.probe.report import FAIL, PASS, CheckResult
from minikv.probe.session import MARGIN_TOKENS, ProbeSession

CANARY_CHARS = 16
MATCH_CHARS = 8  # a shared run this long is not chance: 62**8 possibilities
MAX_TOKENS = 48
LONG_FRACTIONS = (3 / 4, 13 / 16, 7 / 8, 1)  # of the longest prompt the window allows


def holds_canary(text: str, canary: str) -> bool:
    return any(canary[i:i + MATCH_CHARS] in text for i in range(len(canary) - MATCH_CHARS + 1))


def check_canary(s: ProbeSession, result: CheckResult) -> None:
    longest = s.context - MAX_TOKENS - MARGIN_TOKENS
    sizes = [s.scale.words_for(int(longest * f)) for f in LONG_FRACTIONS]
    sizes.append(s.scale.words_over(s.context + MARGIN_TOKENS))
    canaries: list[str] = []
    for words in sizes:
        canaries.append("".join(s.rng.choice(string.ascii_letters + string.digits) for _ in range(CANARY_CHARS)))
        planted = s.client.complete(s.key_a, f"probe: save key {canaries[-1]}.\n", MAX_TOKENS)
        result.note(f"key A: a note holding canary {canaries[-1]}", planted.summary())
        sent, obs = s.send(s.key_b, words, MAX_TOKENS)
        answered = obs.status == HTTPStatus.OK
        leaked = [c for c in canaries if answered and holds_canary(obs.text, c)]
        reply = f"; reply {obs.text[:60]!r}" if answered else ""
        result.note(sent, obs.summary() + reply + ("  <- key A's canary" if leaked else ""))
        if leaked:
            result.decide(FAIL, f"key B's {s.scale.tokens(words):,}-token request returned key A's canary {leaked[0]}")
            return
    result.decide(PASS, "key A's canaries never came back to key B (a leak that depends on timing can still hide)")
