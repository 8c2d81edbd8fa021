"""One owner for a request's step: the runner only chooses tokens, postprocess applies them."""

from __future__ import annotations

import copy

from minikv.config import EngineConfig
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import SafetySwitches
from minikv.engine import Engine
from minikv.postprocess import Sampled, finish_rule, postprocess
from minikv.request import Request, Sequence
from minikv.sampling import SamplingParams


def seq(max_tokens: int = 3) -> Sequence:
    return Sequence("r", "t", [5, 6], max_tokens, SamplingParams(), arrival_s=0.0)


def test_model_runner_changes_no_sequence(tiny):
    """ModelRunner.run returns a token per request and leaves every field of the sequences as it was."""
    engine = Engine(*tiny, EngineConfig(num_pages=16))
    engine.submit(Request("alice: save pin 0912.\n", "alice", 8))
    batch = engine.scheduler.schedule()
    before = [copy.deepcopy(vars(s)) for s in batch.seqs]
    sampled = engine.runner.run(0, batch.phase, batch.seqs, batch.new_tokens)
    assert [vars(s) for s in batch.seqs] == before
    assert len(sampled) == 1 and sampled[0].error is None and isinstance(sampled[0].token, int)


def test_postprocess_appends_advances_and_finishes_once():
    """Each step appends the token and advances num_cached; the finish rule ends it at max_tokens."""
    s, ended = seq(max_tokens=2), []
    fail = lambda q, reason: ended.append(("fail", reason))  # noqa: E731
    postprocess([s], [Sampled(7)], [2], eos_id=0, finish=lambda q: ended.append("finish"), fail=fail)
    assert (s.output_ids, s.num_cached, s.finish_reason, ended) == ([7], 2, None, [])
    postprocess([s], [Sampled(8)], [1], eos_id=0, finish=lambda q: ended.append("finish"), fail=fail)
    assert (s.output_ids, s.num_cached, s.finish_reason, ended) == ([7, 8], 3, "length", ["finish"])
    assert len(s.token_times_s) == 2 and s.first_token_s is not None


def test_finish_rule_stop_before_length():
    """End of text is "stop" even on the last allowed token; below max_tokens without it, go on."""
    s = seq(max_tokens=1)
    s.output_ids = [0]
    assert finish_rule(s, eos_id=0) == "stop"
    s.output_ids = [4]
    assert finish_rule(s, eos_id=0) == "length"
    assert finish_rule(seq(max_tokens=3), eos_id=0) is None


def test_a_failed_choice_goes_to_fail_and_changes_nothing():
    """A Sampled error calls fail with the reason; the sequence gains no token."""
    s, failed = seq(), []
    postprocess([s], [Sampled(error="boom")], [2], 0, finish=lambda q: None, fail=lambda q, r: failed.append(r))
    assert failed == ["boom"] and s.output_ids == [] and s.num_cached == 0


def test_the_cluster_has_one_clock(tiny):
    """Nodes step and the fabric lands by the same clock; only the cluster advances it."""
    cluster = Cluster(*tiny, ClusterConfig(prefill_pages=64, decode_pages=64), SafetySwitches.preset("safe"))
    assert cluster.manager.clock is cluster.clock
    cluster.generate(["alice: save pin 0912.\n"], max_tokens=8)
    steps = {e.step for e in cluster.log.events}
    assert max(steps) == cluster.tick - 1 and cluster.tick == cluster.clock.now
