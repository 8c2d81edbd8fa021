"""Canary: a random string key A sends must never come back to key B.

Key A asks the model to save a fresh canary (the shipped model repeats notes, so the canary
sits in A's KV pages and in A's reply). Right after, key B sends prompts with no canary in them
from three quarters of the window to its top, and past it: the requests that reached freed pages
in the incident. Each is sent right after a fresh canary. The probe runs this check first, before its own traffic fills the pool.
Any part of the canary in B's reply (8 characters or more) is another tenant's data.
"""

from __future__ import annotations

import string
from http import HTTPStatus

from minikv.probe.report import FAIL, PASS, CheckResult
from minikv.probe.session import MARGIN_TOKENS, ProbeSession

CANARY_CHARS = 16
MATCH_CHARS = 8  # a shared run this long is not chance: 62**8 possibilities
MAX_TOKENS = 48
LONG_FRACTIONS = (3 / 4, 13 / 16, 7 / 8, 1)  # of the longest prompt the window allows


def new_canary(s: ProbeSession) -> str:
    return "".join(s.rng.choice(string.ascii_letters + string.digits) for _ in range(CANARY_CHARS))


def holds_canary(text: str, canary: str) -> bool:
    return any(canary[i:i + MATCH_CHARS] in text for i in range(len(canary) - MATCH_CHARS + 1))


def check_canary(s: ProbeSession, result: CheckResult) -> None:
    longest = s.context - MAX_TOKENS - MARGIN_TOKENS
    sizes = [s.scale.words_for(int(longest * f)) for f in LONG_FRACTIONS] + [s.scale.words_over(s.context + MARGIN_TOKENS)]
    canaries = []
    for words in sizes:
        canary = new_canary(s)
        canaries.append(canary)
        planted = s.client.complete(s.key_a, f"probe: save key {canary}.\n", MAX_TOKENS)
        result.note(f"key A: a note holding canary {canary}", planted.summary())
        sent, obs = s.send(s.key_b, words, MAX_TOKENS)
        leaked = [c for c in canaries if obs.status == HTTPStatus.OK and holds_canary(obs.text, c)]
        reply = f"; reply {obs.text[:60]!r}" if obs.status == HTTPStatus.OK else ""
        result.note(sent, obs.summary() + reply + ("  <- key A's canary" if leaked else ""))
        if leaked:
            result.decide(FAIL, f"key B's {s.scale.tokens(words):,}-token request returned key A's canary {leaked[0]}")
            return
    result.decide(PASS, "key A's canaries never came back to key B (a leak that depends on timing can still hide)")
