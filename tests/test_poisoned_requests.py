"""One bad request ends itself, never the node: sampling values, seeds, and faults while serving."""

from __future__ import annotations

import math

import pytest
import torch

import minikv.engine.model_runner
from minikv.engine.config import EngineConfig
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import SafetySwitches
from minikv.engine.engine import Engine
from minikv.engine.request import Request
from minikv.model.sampling import SamplingParams, sample_next

PROMPTS = ["alice: save pin 0912.\n", "bob: save pin 4455.\n", "carol: save pin 7731.\n"]


def make_engine(tiny):
    return Engine(*tiny, EngineConfig(num_pages=24))


def make_cluster(tiny):
    return Cluster(*tiny, ClusterConfig(prefill_pages=64, decode_pages=64, cache_tenants=5),
                   SafetySwitches.preset("safe"))


SERVERS = {"engine": make_engine, "cluster": make_cluster}


def pages_all_free(server) -> bool:
    pools = [server.pool] if isinstance(server, Engine) else [server.prefill_pool, server.decode_pool]
    return all(p.num_free_pages == p.num_pages for p in pools)


EXTREME_BUT_VALID = [
    SamplingParams(temperature=1e-45, seed=1),
    SamplingParams(temperature=1e-300, seed=1),
    SamplingParams(temperature=5e-324, seed=1),
    SamplingParams(temperature=1.0, top_p=1e-300, seed=1),
    SamplingParams(temperature=100.0, top_p=1e-45, seed=2**64 - 1),
]


@pytest.mark.parametrize("kind", SERVERS)
@pytest.mark.parametrize("params", EXTREME_BUT_VALID, ids=repr)
def test_extreme_sampling_values_are_served_and_the_node_goes_on(tiny, kind, params):
    """Tiny temperatures and top_p are served (200), and the next request is served too."""
    server = SERVERS[kind](tiny)
    [poisoned] = server.generate([PROMPTS[0]], max_tokens=16, sampling=params)
    [after] = server.generate([PROMPTS[1]], max_tokens=16)
    assert poisoned.status == 200 and poisoned.text, poisoned.error
    assert after.status == 200 and after.text == "saved pin 4455."
    assert pages_all_free(server)


def test_tiny_temperature_and_top_p_pick_the_top_token():
    """A vanishing temperature or top_p keeps only the most likely token, numerically safely."""
    logits = torch.tensor([1.0, 3.0, 2.9, -50.0])
    for params in (SamplingParams(temperature=1e-300), SamplingParams(temperature=1.0, top_p=1e-300),
                   SamplingParams(temperature=5e-324)):
        picks = {sample_next(logits, params, torch.Generator().manual_seed(s)) for s in range(20)}
        assert picks == {1}, params


INVALID = [
    (SamplingParams(temperature=float("nan")), "temperature", "nan"),
    (SamplingParams(temperature=float("inf")), "temperature", "inf"),
    (SamplingParams(temperature=-1e-300), "temperature", "-1e-300"),
    (SamplingParams(temperature=1e6), "temperature", "1000000.0"),
    (SamplingParams(temperature=True), "temperature", "True"),  # type: ignore[arg-type]
    (SamplingParams(temperature=1.0, top_p=float("nan")), "top_p", "nan"),
    (SamplingParams(temperature=1.0, top_p=0.0), "top_p", "0.0"),
    (SamplingParams(temperature=1.0, top_p=float("inf")), "top_p", "inf"),
    (SamplingParams(temperature=1.0, seed=2**64), "seed", str(2**64)),
    (SamplingParams(temperature=1.0, seed=-1), "seed", "-1"),
    (SamplingParams(temperature=1.0, seed=1.5), "seed", "1.5"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("params, field, shown", INVALID, ids=lambda v: repr(v) if not isinstance(v, str) else v)
def test_invalid_sampling_values_get_the_same_400_on_engine_and_cluster(tiny, params, field, shown):
    """NaN, inf, out-of-range values and seeds past 2**64 are refused with a 400 naming the value, alike on both."""
    errors = []
    for make in SERVERS.values():
        server = make(tiny)
        server.submit(Request(PROMPTS[0], "alice", 8, params))
        [response] = server.run()
        assert response.status == 400 and response.error.startswith(field) and shown in response.error
        errors.append(response.error)
    assert errors[0] == errors[1]


@pytest.mark.parametrize("kind", SERVERS)
def test_same_seed_same_text_on_engine_and_cluster_and_different_seeds_differ(tiny, kind):
    """Seeded sampling repeats on Engine and Cluster alike; another seed gives another text."""
    def text(make, seed):
        return make(tiny).generate([PROMPTS[0]], max_tokens=24, sampling=SamplingParams(temperature=2.0, seed=seed))[0].text

    a = text(SERVERS[kind], 3)
    assert a == text(SERVERS[kind], 3) == text(make_engine, 3)
    assert len({text(SERVERS[kind], s) for s in (3, 4, 5)}) > 1


def raise_for_seed(poisoned_seed: int):
    """A sample_next that fails for the one request whose seed is `poisoned_seed`."""
    def faulty(logits, params, generator):
        if params.seed == poisoned_seed:
            raise RuntimeError("injected fault")
        return sample_next(logits, params, generator)
    return faulty


@pytest.mark.parametrize("kind", SERVERS)
def test_a_fault_in_one_request_of_a_batch_ends_only_that_request(tiny, kind, monkeypatch):
    """Sampling raises for one request of a batch: it gets a 500 with the reason, the others 200, pages come back."""
    monkeypatch.setattr(minikv.engine.model_runner, "sample_next", raise_for_seed(666))
    server = SERVERS[kind](tiny)
    ids = [server.submit(Request(p, p.split(":")[0], 24)) for p in PROMPTS]
    bad = server.submit(Request("dave: save pin 1111.\n", "dave", 24, SamplingParams(temperature=0.5, seed=666)))
    done = {r.request_id: r for r in server.run()}  # all four prefilled in one batch
    assert done[bad].status == 500 and "injected fault" in done[bad].error
    assert [done[i].text for i in ids] == ["saved pin 0912.", "saved pin 4455.", "saved pin 7731."]
    assert pages_all_free(server)
    kinds = [e.detail for e in server.log.events if e.kind == "finish" and e.request_id == bad]
    assert any("failed (500)" in k or "aborted (500)" in k for k in kinds)
    [again] = server.generate([PROMPTS[1]], max_tokens=24)
    assert again.status == 200 and again.text == "saved pin 4455."


def test_a_fault_mid_decode_on_the_cluster_frees_both_halves(tiny, monkeypatch):
    """A request that fails on the decode node (not at prefill) is a 500 and leaves no page behind."""
    calls = {"n": 0}

    def fails_on_third_token(logits, params, generator):
        if params.seed == 666:
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("injected fault")
        return sample_next(logits, params, generator)

    monkeypatch.setattr(minikv.engine.model_runner, "sample_next", fails_on_third_token)
    cluster = make_cluster(tiny)
    good = cluster.submit(Request(PROMPTS[0], "alice", 24))
    bad = cluster.submit(Request(PROMPTS[1], "bob", 24, SamplingParams(temperature=0.5, seed=666)))
    done = {r.request_id: r for r in cluster.run()}
    assert done[bad].status == 500 and done[good].text == "saved pin 0912."
    assert cluster.leaked_pages() == 0 and math.isclose(calls["n"], 3)


@pytest.mark.parametrize("kind", SERVERS)
def test_a_fault_while_checking_a_request_is_a_500_for_it_alone(tiny, kind, monkeypatch):
    """If checking one request raises (here: the tokenizer), that request gets a 500; the next is served."""
    import minikv.engine.front_door

    real = minikv.engine.front_door.encode_prompt

    def fragile(tokenizer, prompt):
        if prompt.startswith("dave"):
            raise TypeError("injected fault")
        return real(tokenizer, prompt)

    monkeypatch.setattr(minikv.engine.front_door, "encode_prompt", fragile)
    server = SERVERS[kind](tiny)
    bad = server.submit(Request("dave: save pin 1111.\n", "dave", 24))
    good = server.submit(Request(PROMPTS[0], "alice", 24))
    done = {r.request_id: r for r in server.run()}
    assert done[bad].status == 500 and "TypeError: injected fault" in done[bad].error
    assert done[good].text == "saved pin 0912."
