"""The shipped model copies unseen secrets exactly: from its prompt, and from someone else's KV."""

from __future__ import annotations

import random

from minikv.engine.config import EngineConfig
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import SafetySwitches
from minikv.engine.engine import Engine
from minikv.engine.request import Request
from minikv.attacks.workload import SECRET_FIELDS, Note, long_document_prompt, note_prompt, random_secret

N = 200


def fresh_notes(seed: int) -> list[Note]:
    rng = random.Random(seed)
    return [Note(rng.choice(SECRET_FIELDS), random_secret(rng)) for _ in range(N)]


def test_copies_secrets_from_the_prompt(tiny):
    """≥ 95% of 200 random secrets (letters, digits, spaces, '-', ',') come back exactly."""
    model, tok = tiny
    notes = fresh_notes(1234)
    engine = Engine(model, tok, EngineConfig(num_pages=1024, max_batch_size=256, audit=False, event_log=False))
    replies = engine.generate([note_prompt("alice", n) for n in notes], max_tokens=64)
    exact = sum(r.text == n.reply for r, n in zip(replies, notes))
    assert exact >= 0.95 * N, f"{exact}/{N} exact copies"


def test_copies_secrets_that_sit_only_in_another_requests_kv(tiny):
    """≥ 95% exact when the note lives only in stale KV written by another request, at that
    request's positions, and the reader's tokens (a one-token placeholder at positions up to
    the whole window away) are unrelated: the geometry of the over-length leak."""
    model, tok = tiny
    notes = fresh_notes(4321)
    rng = random.Random(0)
    config = ClusterConfig(event_log=False)
    vulnerable = SafetySwitches.preset("vulnerable")
    exact = 0
    for i, note in enumerate(notes):
        cluster = Cluster(model, tok, config, vulnerable)
        cluster.submit(Request(note_prompt("alice", note), "alice", 64, request_id="a"))
        cluster.run()
        bob_len = rng.randint(config.prefill_tokens, config.context_len - 64)  # over the prefill pool
        cluster.submit(Request(long_document_prompt("bob", bob_len, rng), "bob", 64, request_id="b"))
        [bob] = cluster.run()
        exact += bob.text == note.reply
    assert exact >= 0.95 * N, f"{exact}/{N} exact copies from stale KV"
