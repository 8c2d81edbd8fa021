"""Checkers for notebook 11 (the leak over HTTP), against the code the server and the probe run:
the key check (`serve.app.tenant_for`) and the canary match (`probe.canary.holds_canary`)."""

import random
import string
from collections.abc import Callable

from minikv.exercises import expect_cases
from minikv.probe.canary import CANARY_CHARS, MATCH_CHARS, holds_canary
from minikv.serve.app import tenant_for
from minikv.serve.schemas import APIError


def served_as(authorization: str | None, keys: dict[str, str]) -> str | None:
    """The tenant the server runs this request as, or None where it answers 401."""
    try:
        return tenant_for(authorization, keys)
    except APIError:
        return None


def check_tenant_of(fn: Callable[[str | None, dict[str, str]], str | None]) -> None:
    """fn(authorization header, {key: tenant}) -> the tenant the request runs as, or None for a 401."""
    rng = random.Random(10)
    keys = {f"sk-{''.join(rng.choices(string.ascii_lowercase + string.digits, k=8))}": tenant
            for tenant in ("alice", "bob", "carol")}
    a, b, _ = keys
    headers = [f"Bearer {a}", f"Bearer {b}", f"bearer {a}", f"Bearer {a} ", f"Basic {a}", a, "Bearer alice",
               f"Bearer {a[:-1]}", "Bearer ", "", None, f"Bearer {b}x", f"BEARER {b}"]
    expect_cases(fn, served_as, [(header, keys) for header in headers], "Authorization {!r} with keys {}",
                 "Only a known key after the word Bearer (any case) names a tenant; anything else is a 401.",
                 "correct on {} headers: the key, and only the key, decides who is who")


def check_holds_canary(fn: Callable[[str, str], bool]) -> None:
    """fn(reply text, canary) -> True when the reply holds a run of 8 or more of the canary's characters."""
    rng = random.Random(11)
    alphabet = string.ascii_letters + string.digits
    cases = []
    for _ in range(8):
        canary = "".join(rng.choices(alphabet, k=CANARY_CHARS))
        start = rng.randrange(CANARY_CHARS - MATCH_CHARS + 1)
        part = canary[start:start + rng.randint(MATCH_CHARS, CANARY_CHARS - start)]
        near = canary[start:start + MATCH_CHARS - 1]  # one character short of a match
        texts = [f"saved key {canary}.", f"saved key {part}.", f"saved key {near}.", "saved nothing.",
                 f"saved key {canary.lower()}.", f"{part[:4]} {part[4:]}"]
        cases += [(text, canary) for text in texts]
    expect_cases(fn, holds_canary, cases, "reply {!r}, canary {!r}",
                 f"A leak shows fragments: any {MATCH_CHARS} characters in a row of the canary count.",
                 "correct on {} replies: whole canaries, fragments and near misses")
