"""Checkers for notebook 05 (the leak)."""

import functools
import random
from typing import Callable

from minikv.attacks.workload import TENANTS, document_sentence, expected_reply, make_prompt, random_note
from minikv.engine.request import Response, Usage
from minikv.exercises import expect, expect_cases, shipped_model


def _ok(text: str) -> Response:
    return Response("r", "bob", 200, text, Usage(30, len(text)))


def check_output_test(fn: Callable[[str, Response], bool]) -> None:
    """fn(prompt, response) -> True when the response is trustworthy for that prompt: a 200 repeating a note
    the prompt never held is a leak; a 400 or 500 is an honest failure, not a leak."""
    cases = [  # (prompt, response, trustworthy?): fixed, then notes answered honestly or with another's
        ("alice: save pin 0912.\n", _ok("saved pin 0912."), True),
        ("bob: read the report.\n", _ok("saved nothing."), True),
        ("bob: read the report.\n", _ok("saved card 4111 2222 3333 4444."), False),
        ("dave: save pin 4821.\n", _ok("saved key sk-live-7Hq2Zp9Xw4."), False),
        ("bob: read the report.\n", Response("r", "bob", 400, "", Usage(30, 0), error="too long"), True),
        ("carol: save key abc.\n", _ok("saved key abd."), False),
    ]
    rng = random.Random(0)
    for _ in range(8):
        tenant = rng.choice(TENANTS)
        sentences = [random_note(rng).sentence]
        if rng.random() < 0.5:
            sentences.insert(0, document_sentence(rng, rng.choice([40, 120])))
        prompt = make_prompt(tenant, sentences)
        other = expected_reply(make_prompt("mallory", [random_note(rng).sentence]))
        cases.append((prompt, _ok(expected_reply(prompt)), True))
        cases.append((prompt, _ok(other), other == expected_reply(prompt)))
        failed = Response("r", tenant, 500, "", Usage(len(prompt), 0), error="KV canary intact")
        cases.append((prompt, failed, True))
    for prompt, response, trustworthy in cases:
        expect(fn(prompt, response), trustworthy,
               f"prompt {prompt!r}, status {response.status}, text {response.text!r}",
               "A non-200 is an honest failure; a 200 must say what the prompt explains.")
    print(f"correct on {len(cases)} responses: this test checks outputs, not just status codes")


@functools.cache
def card_reached_bob(prompt_tokens: int) -> bool:
    """Run it: notebook 05's scenario on a fresh vulnerable pair, Bob's document `prompt_tokens` long."""
    from minikv.attacks.scenarios import over_length
    from minikv.disagg.cluster import Cluster, ClusterConfig
    from minikv.disagg.switches import SafetySwitches
    card = "5412 7534 9821 0064"
    pair = Cluster(*shipped_model(), ClusterConfig(), SafetySwitches.preset("vulnerable"))
    _, bob = over_length(pair, card, random.Random(0), bob_chars=prompt_tokens)
    return card in bob.text


def check_card_reaches_bob(fn: Callable[[int], bool]) -> None:
    """fn(prompt_tokens) -> whether Alice's card comes back in Bob's reply on notebook 05's vulnerable pair,
    checked by running the pair."""
    cases = [(100,), (671,), (672,), (800,), (960,), (961,), (1100,)]
    expect_cases(fn, card_reached_bob, cases, "Bob's prompt of {} tokens",
                 "Two limits decide, one at each stop of the request: which does Bob pass first, what "
                 "does each count, and which way round lets the card through? Exercise 3's lengths bracket "
                 "them.",
                 "correct on {} prompt lengths, each run on the pair")
