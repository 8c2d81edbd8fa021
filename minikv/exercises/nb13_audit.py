"""Notebook 13 (audit an endpoint you did not configure): the audit's requests to a `serve --mystery` server,
what each safety switch makes of them (`expected_evidence`, held against real servers by
tests/test_exercises_capstone.py), which switches that evidence decides, and the checkers that score a
learner's verdicts and explain each one."""

import functools
import itertools
import random
from collections.abc import Callable
from dataclasses import replace

import openai

from minikv.attacks.workload import Note, long_document_prompt, note_prompt
from minikv.disagg.switches import SafetySwitches
from minikv.exercises import expect
from minikv.probe.canary import holds_canary
from minikv.probe.report import FAIL, ProbeReport
from minikv.serve.mystery import draw

SWITCHES = tuple(SafetySwitches.names())
EVERY_DRAW = [SafetySwitches(**dict(zip(SWITCHES, bits)))
              for bits in itertools.product([False, True], repeat=len(SWITCHES))]
LONG_DOCUMENT = 800  # tokens of key B's document: past the incident's 672-token prefill pool, in the window
NOTED = {"B 300": 300, "B 500": 500}  # key B's prompts that hold a note of its own (read back up to ~600)
SHARED_PROMPT = 200  # tokens of the prompt key A sends twice and key B once: under every batch cap and quota
MAX_TOKENS = 40  # enough for a note to come back whole
Verdicts = dict[str, bool | None]  # a switch's name -> on, off, or None: the evidence cannot tell
WORDS = {True: "on", False: "off", None: "?"}

HOW_TO_TELL = {  # what decides each switch, and which way
    "reject_check": "B's 800-token document (past the incident's pool, inside the window): a 400 means on",
    "startup_check": "B's 800-token document: served like any other prompt means a pool that holds the "
                     "window: on",
    "kv_checksum": "B's over-length document let through: a 500 means it or kv_canary is on, a 200 that both "
                   "are off",
    "kv_canary": "B's over-length document let through: a 500 means it or kv_checksum is on, a 200 that both "
                 "are off",
    "deferred_release": "no request of the audit: it acts only when a transfer is cut off and its pages go "
                        "to another tenant at once, a race inside the provider",
    "transfer_batch_cap": "B's 300-token prompt (19 pages in one batch outlast decode's timeout): a 500 "
                          "means off",
    "cache_salt": "B sending A's prompt: cached_tokens > 0 means off (and the partition off too)",
    "cache_partition": "the probe's eviction check (FAIL: off), B reading A's cache (off), B's 500-token "
                       "prompt refused or not read (on: a quota of half the incident's pool)",
    "scrub_on_free": "A repeating its own prompt: cached_tokens 0 means on (a scrubbed page leaves the "
                     "cache)",
}


def expected_evidence(s: SafetySwitches) -> dict[str, str]:
    """What the audit sees on a fresh `serve --mystery` server with switches `s`: B's document after A's
    note ("leak": A's canary in the reply, "200", "400", "500"); B's noted prompts ("read": its own note came
    back, "not read", "400", "500"); A's repeat "cached" or not; B on A's prompt "shared" or "own"; the
    probe's eviction check "shared" (FAIL) or "no sign"."""
    def refused(otherwise: str) -> str:  # a prompt past the tenant's prefill pool, inside the window
        return "400" if s.reject_check else "500" if s.kv_checksum or s.kv_canary else otherwise
    read = "read" if s.transfer_batch_cap else "500"  # 16 pages or more in one batch time out
    cache = not s.scrub_on_free  # scrubbing a freed page drops its cache entry
    evicted = cache and s.startup_check and s.transfer_batch_cap and not s.cache_partition
    return {"B 800": refused("200" if s.scrub_on_free else "leak") if not s.startup_check
            else "200" if s.transfer_batch_cap else "500",
            "B 300": read,
            "B 500": refused("not read") if not s.startup_check and s.cache_partition else read,  # quota: 336
            "A repeats": "cached" if cache else "not cached",
            "B on A's prompt": "shared" if cache and not (s.cache_salt or s.cache_partition) else "own",
            "eviction": "shared" if evicted else "no sign"}


def decided(evidence: dict[str, str]) -> Verdicts:
    """Each switch's value where every draw that gives this evidence agrees on it, else None."""
    verdicts = _by_evidence().get(tuple(sorted(evidence.items())))
    assert verdicts is not None, f"no draw gives this evidence: {evidence}"
    return dict(verdicts)


@functools.cache
def _by_evidence() -> dict[tuple, Verdicts]:
    """Every evidence the 512 draws give -> what it decides."""
    groups: dict[tuple, list[SafetySwitches]] = {}
    for s in EVERY_DRAW:
        groups.setdefault(tuple(sorted(expected_evidence(s).items())), []).append(s)
    return {key: {n: getattr(alike[0], n) if len({getattr(s, n) for s in alike}) == 1 else None
                  for n in SWITCHES} for key, alike in groups.items()}


def gather_evidence(base_url: str, key_a: str, key_b: str, model: str, seed: int = 0) -> tuple[dict, list]:
    """The audit's requests, on a fresh server, with the official client: A's note, then B's 800-token
    document; B's prompts of 300 and 500 tokens, each holding a note of B's own; A's prompt twice, then B's
    copy of it. (evidence, transcript: (who, what was sent, status, reply) per request)."""
    a, b = (openai.OpenAI(base_url=base_url, api_key=k, max_retries=0) for k in (key_a, key_b))
    rng, rows, evidence = random.Random(seed), [], {}

    def send(who: str, what: str, prompt: str) -> tuple[int, str, int]:
        status, text, cached = complete(a if who == "A" else b, model, prompt)
        rows.append((who, what, status, text))
        return status, text, cached

    canary = fresh_note(rng)
    send("A", canary.sentence, note_prompt("alice", canary))
    document = long_document_prompt("bob", LONG_DOCUMENT, rng)
    status, text, _ = send("B", f"{LONG_DOCUMENT}-token document", document)
    leaked = "leak" if holds_canary(text, canary.value) else "200"
    evidence["B 800"] = str(status) if status != 200 else leaked
    for step, tokens in NOTED.items():
        own = fresh_note(rng)
        prompt = noted_prompt("bob", own, tokens, rng)
        status, text, _ = send("B", f"{tokens}-token prompt holding {own.sentence}", prompt)
        read = "read" if holds_canary(text, own.value) else "not read"
        evidence[step] = str(status) if status != 200 else read
    shared = long_document_prompt("alice", SHARED_PROMPT, rng)
    cached = [send(who, f"{what} {SHARED_PROMPT}-token prompt", shared)[2]
              for who, what in (("A", "its"), ("A", "its"), ("B", "A's"))]
    evidence["A repeats"] = "cached" if cached[1] > 0 else "not cached"
    evidence["B on A's prompt"] = "shared" if cached[2] > 0 else "own"
    for client in (a, b):
        client.close()
    return evidence, rows


def fresh_note(rng: random.Random) -> Note:
    """A note holding a canary: 16 characters no reply holds by chance."""
    return Note("key", "".join(rng.choices("abcdefghijkmnpqrstuvwxyz23456789", k=16)))


def noted_prompt(tenant: str, note: Note, num_chars: int, rng: random.Random) -> str:
    """`tenant: save key ... read ...` of exactly `num_chars` characters, answered with the note."""
    head = f"{tenant}: {note.sentence} "
    return head + long_document_prompt(tenant, num_chars - len(note.sentence) - 1, rng)[len(tenant) + 2:]


def complete(client: openai.OpenAI, model: str, prompt: str) -> tuple[int, str, int]:
    """(status, reply text, cached_tokens) of one completion; an error's status with no text."""
    try:
        r = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS)
    except openai.APIStatusError as e:
        return e.status_code, "", 0
    details = r.usage.prompt_tokens_details
    return 200, r.choices[0].text, (details.cached_tokens or 0) if details else 0


def eviction_sign(report: ProbeReport) -> str:
    """The probe's eviction check as evidence: "shared" when it failed, else "no sign" (passed, or unsure)."""
    [result] = [r for r in report.results if r.name == "shared eviction order"]
    return "shared" if result.verdict == FAIL else "no sign"


def never_acted(s: SafetySwitches) -> list[str]:
    """The switches that change none of the audit's evidence when flipped alone: on this endpoint, another fix
    (or the pool's size) keeps every request of the audit from reaching them."""
    seen = expected_evidence(s)
    return [n for n in SWITCHES if expected_evidence(replace(s, **{n: not getattr(s, n)})) == seen]


def explain(seed: int) -> list[tuple[str, bool, bool | None, str]]:
    """(switch, on, what the evidence decides, why) for the seed's server, one a switch."""
    s = draw(seed)
    verdicts, idle = decided(expected_evidence(s)), never_acted(s)
    rows = []
    for n in SWITCHES:
        if verdicts[n] is not None:
            why = f"evidence: {HOW_TO_TELL[n]}"
        elif n in idle:
            why = ("flipped alone it changes no answer: other fixes (or the pool's size) decide all it could "
                   "touch")
        else:
            why = (f"the evidence fits a server with it {WORDS[not getattr(s, n)]} and other fixes changed, "
                   "too")
        rows.append((n, getattr(s, n), verdicts[n], why))
    return rows


def score_verdicts(fn: Callable[[dict[str, str]], Verdicts], seed: int, evidence: dict[str, str]) -> None:
    """fn(evidence) -> {switch: True, False or None}: scored against the seed's server, fix by fix;
    AssertionError if a verdict the evidence decides is wrong or missing, or the evidence is another's."""
    verdicts = fn(dict(evidence))
    assert isinstance(verdicts, dict) and set(verdicts) <= set(SWITCHES), \
        f"return a dict of switch names ({', '.join(SWITCHES)}) to True, False or None; got {verdicts!r}"
    want = expected_evidence(draw(seed))
    assert evidence == want, \
        f"seed {seed}'s server gives {want} on a fresh start, not this evidence: restart it"
    rows, wrong = explain(seed), []
    for n, on, decides, why in rows:
        said = verdicts.get(n)
        mark = "cannot tell" if decides is None else "right" if said == on else "WRONG"
        wrong += [n] if mark == "WRONG" else []
        print(f"{n:18} yours {WORDS[said]:4} server {WORDS[on]:4} {mark:11} {why}")
    if wrong:
        raise AssertionError(f"{len(wrong)} verdict(s) the evidence decides are wrong or missing: "
                             f"{', '.join(wrong)}")
    told = sum(v is not None for _, _, v, _ in rows)
    print(f"all {told} verdicts the evidence decides are right; "
          f"{len(SWITCHES) - told} fixes no request of the audit could show")


def check_every_endpoint(fn: Callable[[dict[str, str]], Verdicts]) -> None:
    """fn(evidence) -> verdicts, on the evidence of every one of the 512 draws: exactly what it decides, and
    None where draws that give the same evidence differ (a guess there is wrong on some endpoint)."""
    for key, want in _by_evidence().items():
        evidence = dict(key)
        verdicts = fn(dict(evidence))
        if not isinstance(verdicts, dict):
            raise AssertionError(f"evidence {evidence}: expected a dict of switch names to True, False or "
                                 f"None, got {verdicts!r}")
        got = {n: verdicts.get(n) for n in SWITCHES}
        expect(got, want, f"evidence {evidence}",
               "None where the evidence cannot decide; a value where it can.")
    print(f"right on all {len(_by_evidence())} kinds of evidence the 512 draws give")


def check_predictions(fn: Callable[[SafetySwitches], dict[str, str]]) -> None:
    """fn(switches) -> the evidence a fresh mystery server with those switches gives, on all 512 draws,
    against expected_evidence (which tests/test_exercises_capstone.py holds against real servers)."""
    for s in EVERY_DRAW:
        on = [n for n in SWITCHES if getattr(s, n)]
        expect(fn(s), expected_evidence(s), f"switches on: {', '.join(on) or 'none'}",
               "Follow one request at a time: which fix stops it first, and what does the client get then?")
    print(f"right on all {len(EVERY_DRAW)} draws")
