"""The front door, the same on Engine and Cluster: engine-owned ids, each answer to its own tenant exactly once."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minikv.engine.config import EngineConfig
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import SafetySwitches
from minikv.engine.engine import Engine
from minikv.engine.request import Request
from minikv.serve.schemas import engine_refusal

TENANTS = ("alice", "bob", "carol")
PINS = ("0912", "4455", "7731", "2048")
# client ids an attacker would pick: the engine's own automatic ids, each other's, one shared name
CLIENT_IDS = (None, None, "req-0", "req-1", "req-2", "req-3", "alice-1", "x", "x")


def prompt_for(tenant: str, pin: str) -> str:
    return f"{tenant}: save pin {pin}.\n"


def make_engine(tiny):
    model, tok = tiny
    return Engine(model, tok, EngineConfig(num_pages=24, max_batch_size=3))


def make_cluster(tiny):
    model, tok = tiny
    return Cluster(model, tok, ClusterConfig(prefill_pages=64, decode_pages=64), SafetySwitches.preset("safe"))


SERVERS = {"engine": make_engine, "cluster": make_cluster}


@pytest.fixture(scope="module")
def expected_text(tiny):
    """What the model answers to each (tenant, pin) prompt when it runs alone."""
    engine = Engine(*tiny, EngineConfig(num_pages=64))
    keys = [(t, p) for t in TENANTS for p in PINS]
    return dict(zip(keys, (r.text for r in engine.generate([prompt_for(*k) for k in keys], max_tokens=24))))


@dataclass(frozen=True)
class Submission:
    step: int
    tenant: str
    pin: str
    client_id: str | None
    cancel_after: int | None  # steps after arrival; None never


submissions = st.lists(
    st.builds(Submission, st.integers(0, 12), st.sampled_from(TENANTS), st.sampled_from(PINS),
              st.sampled_from(CLIENT_IDS), st.none() | st.integers(0, 6)),
    min_size=1, max_size=8,
)


def play(server, workload: list[Submission], expected_text: dict) -> None:
    """Submit and cancel as the workload says; check every handover against who submitted what."""
    pending: dict[str, Submission] = {}  # engine id -> the submission it answers; one at a time
    answered: list[Submission] = []
    cancels: dict[int, list[str]] = {}
    for step in range(400):
        for sub in [s for s in workload if s.step == step]:
            rid = server.submit(Request(prompt_for(sub.tenant, sub.pin), sub.tenant, 24, request_id=sub.client_id))
            assert rid not in pending, f"engine id {rid} handed out while still held"
            pending[rid] = sub
            if sub.cancel_after is not None:
                cancels.setdefault(step + sub.cancel_after, []).append(rid)
        for rid in cancels.pop(step, []):
            server.cancel(rid)  # may be answered already: then it is a no-op, or another holder's id
        responses = server.step()
        server.check_integrity()
        for response in responses:
            sub = pending.pop(response.request_id)  # KeyError: an answer nobody is waiting for
            assert response.tenant == sub.tenant and response.client_request_id == sub.client_id
            if response.status == 200:
                assert response.text == expected_text[(sub.tenant, sub.pin)]
            else:
                assert response.status in (400, 499), response.error
            answered.append(sub)
        if step > max(s.step for s in workload) and not server.has_work():
            break
    assert not pending and sorted(map(id, answered)) == sorted(map(id, workload)), "a submission never answered"
    assert server.book.held() == 0


@pytest.mark.parametrize("kind", SERVERS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=submissions)
def test_every_response_reaches_its_own_tenant_exactly_once(tiny, expected_text, kind, workload):
    """Random workloads with adversarial client ids: each answer goes once, to the tenant that asked."""
    play(SERVERS[kind](tiny), workload, expected_text)


@pytest.mark.parametrize("kind", SERVERS)
def test_a_client_id_that_looks_automatic_cannot_take_another_tenants_answer(tiny, kind):
    """Alice names her request req-0; Bob's automatic id is not req-0 and Bob gets his own answer."""
    server = SERVERS[kind](tiny)
    alice = server.submit(Request(prompt_for("alice", "0912"), "alice", 24, request_id="req-0"))
    bob = server.submit(Request(prompt_for("bob", "4455"), "bob", 24))
    done = {r.request_id: r for r in server.run()}
    assert alice != bob and done[alice].tenant == "alice" and done[bob].tenant == "bob"
    assert "0912" in done[alice].text and "0912" not in done[bob].text
    assert done[alice].client_request_id == "req-0" and done[bob].client_request_id is None


@pytest.mark.parametrize("kind", SERVERS)
def test_duplicate_live_id_from_the_same_tenant_is_a_400_and_the_first_is_untouched(tiny, kind):
    """A second live 'x' from alice is refused; bob's 'x' and alice's first 'x' are both served."""
    server = SERVERS[kind](tiny)
    first = server.submit(Request(prompt_for("alice", "0912"), "alice", 24, request_id="x"))
    dup = server.submit(Request(prompt_for("alice", "7731"), "alice", 24, request_id="x"))
    bobs = server.submit(Request(prompt_for("bob", "4455"), "bob", 24, request_id="x"))
    done = {r.request_id: r for r in server.run()}
    assert len({first, dup, bobs}) == 3
    assert done[dup].status == 400 and "duplicate request_id 'x'" in done[dup].error
    assert done[first].status == done[bobs].status == 200 and "0912" in done[first].text


@pytest.mark.parametrize("kind", SERVERS)
def test_a_finished_id_can_be_reused_and_the_old_answer_is_not_replaced(tiny, kind):
    """Once 'x' is answered, alice may use 'x' again; the first answer was handed over unchanged."""
    server = SERVERS[kind](tiny)
    server.submit(Request(prompt_for("alice", "0912"), "alice", 24, request_id="x"))
    [first] = server.run()
    server.submit(Request(prompt_for("alice", "7731"), "alice", 24, request_id="x"))
    [second] = server.run()
    assert first.status == second.status == 200
    assert "0912" in first.text and "7731" in second.text


@pytest.mark.parametrize("kind", SERVERS)
@pytest.mark.parametrize("field, value", [("request_id", 5), ("request_id", b"x"), ("tenant", 7), ("tenant", None)])
def test_non_string_tenant_or_request_id_is_a_clear_400(tiny, kind, field, value):
    """A non-string tenant or request_id is answered 400 naming the field, not a TypeError."""
    server = SERVERS[kind](tiny)
    kwargs = {"tenant": "alice", "request_id": None} | {field: value}
    server.submit(Request(prompt_for("alice", "0912"), max_tokens=8, **kwargs))
    [response] = server.run()
    assert response.status == 400 and response.error.startswith(field)


@pytest.mark.parametrize("kind", SERVERS)
def test_handover_checks_the_tenant(tiny, kind, monkeypatch):
    """A response built for the wrong tenant trips the delivery invariant instead of reaching anyone."""
    from minikv.engine import front_door

    server = SERVERS[kind](tiny)
    real = front_door.to_response

    def misrouted(*args, **kwargs):
        response = real(*args, **kwargs)
        response.tenant = "mallory"
        return response

    monkeypatch.setattr(front_door, "to_response", misrouted)
    server.submit(Request(prompt_for("alice", "0912"), "alice", 8))
    with pytest.raises(AssertionError, match="would go to 'alice'"):
        server.run()


@pytest.mark.parametrize("kind", SERVERS)
def test_generate_leaves_other_answers_for_the_next_step(tiny, kind):
    """generate() returns its own answers in prompt order; a request submitted before it is still handed over."""
    server = SERVERS[kind](tiny)
    other = server.submit(Request(prompt_for("carol", "2048"), "carol", 24))
    got = server.generate([prompt_for("alice", "0912"), prompt_for("alice", "7731")], max_tokens=24, tenant="alice")
    assert ["0912" in got[0].text, "7731" in got[1].text] == [True, True]
    rest = server.run()
    assert [r.request_id for r in rest] == [other] and rest[0].tenant == "carol"


@pytest.mark.parametrize("kind", SERVERS)
def test_a_refusal_carries_the_field_it_names_as_data(tiny, kind):
    """A 400 names its request field (OpenAI's `param`) and code as data, whatever words its reason starts
    with: a tenant called "stop" is no `stop` field, a too-long prompt is `context_length_exceeded`."""
    server = SERVERS[kind](tiny)
    refused = {"tenant": Request(prompt_for("stop", "0912"), tenant=""),
               "max_tokens": Request(prompt_for("alice", "0912"), tenant="stop", max_tokens=0),
               "long": Request("alice " * 2000, tenant="alice")}
    ids = {name: server.submit(request) for name, request in refused.items()}
    answers = {r.request_id: r for r in server.step()}
    got = {name: (answers[i].status, answers[i].error_code, answers[i].error_param) for name, i in ids.items()}
    assert got == {"tenant": (400, "invalid_value", None), "max_tokens": (400, "invalid_value", "max_tokens"),
                   "long": (400, "context_length_exceeded", "prompt")}


def test_a_tenant_named_like_a_field_is_refused_naming_no_field(tiny):
    """A partitioned pool refuses a tenant past its slots; that tenant being called "stop" makes the refusal
    about no request field: the HTTP error's `param` is null (a reading of the reason's words would say stop)."""
    model, tok = tiny
    engine = Engine(model, tok, EngineConfig(num_pages=64, cache_partition=True, cache_tenants=1))
    engine.submit(Request(prompt_for("alice", "0912"), tenant="alice", max_tokens=4))
    refused = engine.submit(Request(prompt_for("stop", "4455"), tenant="stop", max_tokens=4))
    answer = {r.request_id: r for r in engine.run()}[refused]
    error = engine_refusal(answer.status, answer.error, answer.error_code, answer.error_param).body()["error"]
    assert answer.status == 400 and "refused" in answer.error
    assert (error["code"], error["param"]) == ("invalid_value", None)
