"""One owner for a request's step: the runner only chooses tokens, the scheduler's postprocess applies them."""

from __future__ import annotations

import copy

from minikv.engine.config import EngineConfig
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import SafetySwitches
from minikv.engine.engine import Engine
from minikv.engine.model_runner import Sampled
from minikv.engine.request import Request, Sequence
from minikv.model.sampling import SamplingParams


def seq(max_tokens: int = 3, stop: tuple[str, ...] = ()) -> Sequence:
    return Sequence("r", "t", [5, 6], max_tokens, SamplingParams(), arrival_s=0.0, stop=stop)


def scheduler(tiny):
    return Engine(*tiny, EngineConfig(num_pages=16)).scheduler


def test_model_runner_changes_no_sequence(tiny):
    """ModelRunner.run returns a token per request and leaves every field of the sequences as it was."""
    engine = Engine(*tiny, EngineConfig(num_pages=16))
    engine.submit(Request("alice: save pin 0912.\n", "alice", 8))
    batch = engine.scheduler.schedule()
    before = [copy.deepcopy(vars(s)) for s in batch.seqs]
    sampled = engine.runner.run(0, batch.phase, batch.seqs, batch.new_tokens)
    assert [vars(s) for s in batch.seqs] == before
    assert len(sampled) == 1 and sampled[0].error is None and isinstance(sampled[0].token, int)


def test_postprocess_appends_advances_and_finishes_once(tiny):
    """Each step appends the token and advances num_cached; the finish rule ends it at max_tokens."""
    s, sched = seq(max_tokens=2), scheduler(tiny)
    assert sched.postprocess([s], [Sampled(7)], [2]) == []
    assert (s.output_ids, s.num_cached, s.finish_reason) == ([7], 2, None)
    [ended] = sched.postprocess([s], [Sampled(8)], [1])
    assert (s.output_ids, s.num_cached, s.finish_reason, ended.seq, ended.status) == ([7, 8], 3, "length", s, 200)
    assert len(s.token_times_s) == 2 and s.first_token_s == s.token_times_s[0]


def test_finish_rule_stop_before_length(tiny):
    """End of text is "stop" even on the last allowed token; below max_tokens without it, go on."""
    sched, eos = scheduler(tiny), tiny[1].eos_token_id
    s = seq(max_tokens=1)
    s.output_ids = [eos]
    assert sched.finish_rule(s) == "stop"
    s.output_ids = [4]
    assert sched.finish_rule(s) == "length"
    s = seq(max_tokens=3)
    s.output_ids = [4]
    assert sched.finish_rule(s) is None


def test_a_failed_choice_ends_that_request_and_changes_nothing(tiny):
    """A Sampled error ends the request with a 500 and the reason; the sequence gains no token."""
    s = seq()
    [ended] = scheduler(tiny).postprocess([s], [Sampled(error="boom")], [2])
    assert (ended.status, ended.error, s.output_ids, s.num_cached, s.finish_reason) == (500, "boom", [], 0, "abort")


def test_a_stop_string_ends_the_request_inside_the_engine(tiny):
    """The engine itself ends a request at its stop string: a 200 with finish_reason "stop", the text cut
    before the stop, its pages freed at once; no cancel, no 499 (nothing for a server to rewrite)."""
    model, tok = tiny
    engine = Engine(model, tok, EngineConfig(num_pages=16))
    [free] = engine.generate(["alice: save pin 0912.\n"], max_tokens=24)
    assert free.status == 200 and len(free.text) >= 6
    stop = free.text[3:5]  # two characters the reply is known to hold
    rid = engine.submit(Request("alice: save pin 0912.\n", "alice", 24, stop=(stop,)))
    [stopped] = engine.run()
    assert stopped.request_id == rid and stopped.status == 200 and stopped.finish_reason == "stop"
    assert stopped.text == free.text[: free.text.index(stop)] and stop not in stopped.text
    assert stopped.usage.completion_tokens < free.usage.completion_tokens
    assert not engine.log.of_kind("cancel") and engine.pool.num_free_pages == engine.pool.num_pages
    assert [e.detail for e in engine.log.of_kind("finish")][-1] == "stop"


def test_the_cluster_has_one_clock(tiny):
    """Nodes step and the fabric lands by the same clock; only the cluster advances it."""
    cluster = Cluster(*tiny, ClusterConfig(prefill_pages=64, decode_pages=64), SafetySwitches.preset("safe"))
    assert cluster.manager.clock is cluster.clock
    cluster.generate(["alice: save pin 0912.\n"], max_tokens=8)
    steps = {e.step for e in cluster.log.events}
    assert max(steps) == cluster.tick - 1 and cluster.tick == cluster.clock.now
