"""Chunked prefill: a long prompt in pieces of max_prefill_tokens, a decode step after each."""

from __future__ import annotations

import argparse

from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import SafetySwitches
from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.engine.request import Request
from minikv.serve.flags import SAFE_PREFILL_CHUNK, add_serve_arguments, chunk_of

LONG = "bob: read " + "the quarterly report and the budget review " * 14 + "\n"  # about 600 tokens
SHORT = "alice: save pin 0912.\n"


def serve(tiny, **config) -> tuple[dict, Engine]:
    engine = Engine(*tiny, EngineConfig(num_pages=128, **config))
    engine.submit(Request(SHORT, "alice", 40, request_id="alice"))
    engine.step()  # alice is prefilled and decoding when bob's long prompt arrives
    engine.submit(Request(LONG, "bob", 8, request_id="bob"))
    return {r.request_id: r for r in engine.run()}, engine


def test_chunks_give_the_same_answers(tiny):
    """Greedy answers are the same with the prompt prefilled whole or in chunks of 128 tokens."""
    whole, _ = serve(tiny)
    chunked, engine = serve(tiny, max_prefill_tokens=128, chunked_prefill=True)
    assert {k: r.text for k, r in whole.items()} == {k: r.text for k, r in chunked.items()}
    assert all(r.status == 200 for r in chunked.values())
    engine.check_integrity()


def test_decode_steps_run_between_the_chunks(tiny):
    """Bob's ~600-token prompt takes five prefill steps of at most 128 tokens, each followed by a
    decode step of alice's: she is never held up by more than one chunk."""
    _, engine = serve(tiny, max_prefill_tokens=128, chunked_prefill=True)
    writes = [e for e in engine.log.of_kind("write")]
    bob_steps = sorted({e.step for e in writes if e.request_id == "bob" and e.detail.startswith("prefill")})
    alice_steps = {e.step for e in writes if e.request_id == "alice" and e.detail.startswith("decode")}
    assert len(bob_steps) >= 5
    assert all(step + 1 in alice_steps for step in bob_steps[:-1]), (bob_steps, sorted(alice_steps))
    sizes = [int(e.detail.split(": ")[1].split(" ")[0]) for e in writes if e.request_id == "bob" and e.detail.startswith("prefill")]
    assert max(sizes) <= 128 and sum(sizes) == len(LONG)


def test_without_chunks_the_prompt_is_one_step(tiny):
    """The default: bob's whole prompt in one prefill step (the behaviour the notebooks show)."""
    _, engine = serve(tiny)
    bob = {e.step for e in engine.log.of_kind("write") if e.request_id == "bob" and e.detail.startswith("prefill")}
    assert len(bob) == 1


def test_the_pairs_prefill_node_prefills_in_chunks(tiny):
    """`ClusterConfig(chunked_prefill=True)`: the prefill node takes bob's prompt 128 tokens a step over
    several steps and ships it whole; the answers are those of whole-prompt prefill."""
    def pair(**config) -> tuple[dict, Cluster]:
        shared = SafetySwitches.preset("safe").with_switches(disable=["cache_partition"])  # bob's prompt: most of the pool
        cluster = Cluster(*tiny, ClusterConfig(context_len=672, **config), shared)
        cluster.submit(Request(SHORT, "alice", 8, request_id="alice"))
        cluster.submit(Request(LONG, "bob", 8, request_id="bob"))
        return {r.client_request_id: r for r in cluster.run()}, cluster

    whole, _ = pair()
    chunked, cluster = pair(max_prefill_tokens=128, chunked_prefill=True)
    answers = {k: (r.status, r.text) for k, r in whole.items()}
    assert {k: (r.status, r.text) for k, r in chunked.items()} == answers
    writes = [e for e in cluster.log.of_kind("write") if e.node == "prefill" and "prefill" in e.detail]
    bob = [e for e in writes if e.request_id == "bob"]
    assert len({e.step for e in bob}) >= 5
    cluster.check_integrity()


def test_safe_serve_chunks_by_default_and_the_pair_too():
    """`minikv serve` prefills in chunks of SAFE_PREFILL_CHUNK under --preset safe, whole prompts under
    vulnerable; --prefill-chunk sets it (off: whole), with --disagg as without."""
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    chunk = lambda *argv: chunk_of(parser.parse_args(list(argv)))  # noqa: E731
    assert chunk() == chunk("--disagg") == SAFE_PREFILL_CHUNK
    assert chunk("--preset", "vulnerable") is None and chunk("--prefill-chunk", "off") is None
    assert chunk("--disagg", "--prefill-chunk", "64") == 64
    assert chunk("--preset", "vulnerable", "--prefill-chunk", "64") == 64
