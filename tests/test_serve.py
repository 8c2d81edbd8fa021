"""`minikv serve` over real HTTP: the official openai client and raw httpx against a child-process server."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from http import HTTPStatus

import httpx
import openai
import pytest

from minikv.logs.gateway_log import GatewayRecord, iter_log
from minikv.serve.launch import ServerProcess
from minikv.attacks.workload import long_document_prompt

MODEL = "tiny-llama"
TENANTS = [f"t{i:02d}" for i in range(32)]
KEYS = {t: f"sk-{t}-{i:04d}" for i, t in enumerate(TENANTS)}
CARD = "4539 1488 0343 6467"  # passes the Luhn check, so scan-logs knows it for a card


def key_args(keys: dict[str, str]) -> list[str]:
    return [a for tenant, key in keys.items() for a in ("--api-key", f"{tenant}={key}")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One engine, 32 tenants, a gateway log."""
    log = tmp_path_factory.mktemp("serve") / "gateway.jsonl"
    with ServerProcess([*key_args(KEYS), "--log", str(log)]) as s:
        s.log = log
        yield s


def client(server, tenant: str = "t00") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=KEYS[tenant], max_retries=0)


def post(server, path: str, body, key: str | None = KEYS["t00"], **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=data, headers=headers, timeout=30, **kw)


def assert_openai_error(r: httpx.Response, status: int, code: str | None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] == code
    return err


def still_serves(server) -> None:
    r = client(server).completions.create(model=MODEL, prompt="t00: save pin 4821.\n", max_tokens=20)
    assert r.choices[0].text == "saved pin 4821."


def test_completion_with_usage(server):
    """/v1/completions through the official client: the note repeated, usage with cached_tokens."""
    r = client(server).completions.create(model=MODEL, prompt="t00: save pin 0912.\n", max_tokens=20)
    assert r.choices[0].text == "saved pin 0912." and r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == len("t00: save pin 0912.\n")
    assert r.usage.completion_tokens == len("saved pin 0912.") + 1  # and the end-of-text token
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_completion(server):
    """/v1/chat/completions: one user message is the model's one-line prompt."""
    r = client(server).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "t00: save key ab12."}])
    assert r.choices[0].message.content == "saved key ab12." and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len("t00: save key ab12.\n")


def test_streamed_completion_matches_whole(server):
    """Streaming by SSE: the chunks join to the non-streamed text; usage arrives last."""
    c = client(server)
    whole = c.completions.create(model=MODEL, prompt="t00: save card 1111 2222.\n", max_tokens=40)
    chunks = list(c.completions.create(model=MODEL, prompt="t00: save card 1111 2222.\n", max_tokens=40,
                                       stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text and len([ch for ch in chunks if ch.choices and ch.choices[0].text]) > 1
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize("prompt", ["t00: save pin 31.\n", "q w e r t y\n"])  # the second ends at once, empty
def test_each_streamed_call_is_logged_once(server, prompt):
    """A streamed call, with text or without any, is one gateway-log row under its id."""
    chunks = list(client(server).completions.create(model=MODEL, prompt=prompt, max_tokens=20, stream=True))
    rows = [r for r in iter_log(server.log) if isinstance(r, GatewayRecord) and r.request_id == chunks[0].id]
    assert len(rows) == 1 and rows[0].status == 200
    assert rows[0].response_text == "".join(ch.choices[0].text for ch in chunks if ch.choices)


def test_streamed_chat(server):
    """Streamed chat: role first, content deltas, a finish reason."""
    chunks = list(client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "t00: save pin 77."}], stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "saved pin 77."
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_string_ends_the_reply(server):
    """`stop` cuts the reply before the stop string, streamed or not, with finish_reason stop."""
    c = client(server)
    r = c.completions.create(model=MODEL, prompt="t00: save pin 4821.\n", max_tokens=20, stop=["48"])
    assert r.choices[0].text == "saved pin " and r.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=MODEL, prompt="t00: save pin 4821.\n", max_tokens=20, stop=["48"], stream=True) if ch.choices)
    assert streamed == "saved pin "


def test_models_lists_the_context(server):
    """/v1/models names the model and advertises its window as max_model_len."""
    [card] = client(server).models.list().data
    assert card.id == MODEL and card.max_model_len == 1024


@pytest.mark.parametrize("key", [None, "sk-nobody"])
def test_missing_or_unknown_key_is_401(server, key):
    """No key or an unknown key: 401 in OpenAI's shape."""
    assert_openai_error(post(server, "/v1/completions", {"model": MODEL, "prompt": "x"}, key=key), 401, "invalid_api_key")


def test_official_client_sees_401(server):
    """The official client raises its AuthenticationError for an unknown key."""
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url, api_key="sk-wrong", max_retries=0).models.list()


def test_unknown_model_is_404(server):
    """An unknown model: 404 model_not_found."""
    assert_openai_error(post(server, "/v1/completions", {"model": "gpt-9", "prompt": "x"}), 404, "model_not_found")


def test_over_length_is_400_naming_both_numbers(server):
    """A prompt past the window: 400 context_length_exceeded with the prompt's size and the window's."""
    err = assert_openai_error(post(server, "/v1/completions", {"model": MODEL, "prompt": "a" * 1100}), 400, "context_length_exceeded")
    assert "1100" in err["message"] and "1024" in err["message"]


def test_huge_body_is_413(server):
    """A body over the limit: 413, declared or streamed without a length."""
    big = json.dumps({"model": MODEL, "prompt": "a" * (2 << 20)})
    assert_openai_error(post(server, "/v1/completions", big), 413, "request_too_large")
    chunked = (big[i:i + 65536].encode() for i in range(0, len(big), 65536))
    r = httpx.post(server.url + "/v1/completions", content=chunked, headers={"Authorization": f"Bearer {KEYS['t00']}"}, timeout=30)
    assert_openai_error(r, 413, "request_too_large")
    still_serves(server)


BAD_BODIES = [
    ("{not json", "invalid_json"),
    ("[1, 2]", "invalid_json"),
    ({"model": MODEL}, "invalid_type"),
    ({"model": MODEL, "prompt": 42}, "invalid_type"),
    ({"model": MODEL, "prompt": "x", "max_tokens": "7"}, "invalid_type"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, "invalid_value"),
    ({"model": MODEL, "prompt": "x", "max_tokens": -5}, "invalid_value"),
    ({"model": MODEL, "prompt": "x", "temperature": -1}, "invalid_value"),
    ({"model": MODEL, "prompt": "x", "top_p": 3}, "invalid_value"),
    ({"model": MODEL, "prompt": "x", "seed": -1}, "invalid_value"),
    ({"model": MODEL, "prompt": "x", "seed": 2**70}, "invalid_type"),
    ({"model": MODEL, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "invalid_value"),
    ({"model": MODEL, "prompt": "x", "n": 2}, "invalid_value"),
    ({"model": MODEL, "prompt": ["x", "y"]}, "invalid_value"),
    ({"model": MODEL, "prompt": ""}, "invalid_value"),
    ({"model": MODEL, "prompt": "caf\u00e9"}, "invalid_value"),
    ({"model": MODEL, "prompt": "x", "cache_salt": "s" * 1000}, "invalid_type"),
    ({"model": MODEL, "prompt": "x", "stream": "yes"}, "invalid_type"),
]


@pytest.mark.parametrize("body,code", BAD_BODIES, ids=[str(i) for i in range(len(BAD_BODIES))])
def test_bad_input_is_400_and_the_server_serves_on(server, body, code):
    """Each bad body: 400 in OpenAI's shape, then a normal request still works."""
    assert_openai_error(post(server, "/v1/completions", body), 400, code)
    still_serves(server)


def test_bad_chat_bodies_are_400(server):
    """Chat with no messages, or a message without text: 400."""
    for body in ({"model": MODEL, "messages": []}, {"model": MODEL, "messages": [{"role": "user"}]},
                 {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}):
        assert_openai_error(post(server, "/v1/chat/completions", body), 400, "invalid_type")
    still_serves(server)


def test_32_concurrent_clients_answered_once_each_as_their_tenant(server):
    """32 clients at once, each with its own key and note: each gets its own note, logged under its tenant."""
    results: dict[str, tuple[str, str]] = {}
    barrier = threading.Barrier(len(TENANTS))
    steps_before = server.health()["steps"]

    def one(tenant: str, pin: str) -> None:
        c = client(server, tenant)
        barrier.wait()
        r = c.completions.create(model=MODEL, prompt=f"{tenant}: save pin {pin}.\n", max_tokens=24)
        results[tenant] = (r.id, r.choices[0].text)

    pins = {t: f"{random.Random(i).randrange(10**6):06d}" for i, t in enumerate(TENANTS)}
    threads = [threading.Thread(target=one, args=(t, pins[t])) for t in TENANTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert {t: text for t, (_, text) in results.items()} == {t: f"saved pin {pins[t]}." for t in TENANTS}
    steps = server.health()["steps"] - steps_before
    assert steps < len(TENANTS) * len("saved pin 000000.") / 2, f"{steps} steps: the clients were not batched together"
    ids = {rid for rid, _ in results.values()}
    logged = [r for r in iter_log(server.log) if isinstance(r, GatewayRecord) and r.request_id in ids]
    assert len(ids) == len(logged) == len(TENANTS)  # one id and one log row per call
    rows = {r.request_id: r for r in logged}
    assert all(rows[rid].account == t and rows[rid].status == 200 for t, (rid, _) in results.items())


def test_disconnect_mid_stream_cancels_and_frees_pages(server):
    """A client that leaves mid-stream: its request is cancelled at once and every page comes back."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1000, "stream": True}  # 'xxxx...' for 1,000 steps
    with httpx.stream("POST", server.url + "/v1/completions", json=body,
                      headers={"Authorization": f"Bearer {KEYS['t01']}"}, timeout=30) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        assert server.health()["live_requests"] == 1
    for _ in range(30):  # 1.5 s: generating the other ~1,000 tokens would take several seconds
        health = server.health()
        if health["live_requests"] == 0:
            break
        time.sleep(0.05)
    pool = health["pools"]["single"]
    assert health["live_requests"] == 0 and pool["free_pages"] == pool["total_pages"]
    rows = [r for r in iter_log(server.log) if isinstance(r, GatewayRecord) and r.account == "t01"]
    assert rows[-1].status == 499 and 0 < rows[-1].completion_tokens < 1000
    still_serves(server)


def test_gateway_log_is_the_scan_logs_schema_without_prompts(server):
    """Every line of the server's log parses as a gateway record, and no prompt text is in it."""
    marker = "t00: save memo zqxjzqxj.\n"
    client(server).completions.create(model=MODEL, prompt=marker, max_tokens=1)
    items = list(iter_log(server.log))
    assert items and all(isinstance(i, GatewayRecord) for i in items)
    assert "zqxjzqxj" not in server.log.read_text() and "zqxjzqxj" not in server.output()


def test_sigterm_stops_the_server_cleanly():
    """SIGTERM: the server finishes, says so, and exits 0."""
    s = ServerProcess(["--api-key", "a=sk-aaaaaaaa"])
    assert s.stop() == 0
    assert "server stopped" in s.output()


def test_startup_check_refuses_the_mismatched_cluster():
    """The safe preset will not serve a 1,024-token window over a 672-token prefill pool: exit 2, both named."""
    r = subprocess.run([sys.executable, "-m", "minikv", "serve", "--disagg", "--preset", "safe", "--port", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "1024" in r.stderr and "672" in r.stderr and r.stderr.startswith("error: startup_check")


# --- the leak over HTTP ---------------------------------------------------------------------------

LEAK_KEYS = {"alice": "sk-alice-0001", "bob": "sk-bob-0002"}


def alice_and_bob(server) -> tuple[openai.OpenAI, openai.OpenAI, str]:
    alice, bob = (openai.OpenAI(base_url=server.base_url, api_key=LEAK_KEYS[t], max_retries=0) for t in ("alice", "bob"))
    saved = alice.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"alice: save card {CARD}."}])
    assert saved.choices[0].message.content == f"saved card {CARD}."
    return alice, bob, long_document_prompt("bob", 800, random.Random(0))  # > 672-token pool, < 1,024 window


def test_vulnerable_cluster_hands_bob_alice_card_and_scan_logs_flags_it(tmp_path):
    """--disagg --preset vulnerable: Bob's 800-token prompt gets 200 and Alice's card; scan-logs flags Bob's call."""
    log = tmp_path / "gateway.jsonl"
    with ServerProcess(["--disagg", "--preset", "vulnerable", *key_args(LEAK_KEYS), "--log", str(log)]) as s:
        _, bob, prompt = alice_and_bob(s)
        r = bob.completions.create(model=MODEL, prompt=prompt, max_tokens=64)
    assert CARD in r.choices[0].text and r.usage.prompt_tokens == 800
    scan = subprocess.run([sys.executable, "-m", "minikv", "scan-logs", str(log), "--json"], capture_output=True, text=True)
    flags = {f["request_id"]: f["reasons"] for f in json.loads(scan.stdout)["flags"]}
    assert scan.returncode == 1 and "card_number" in flags[r.id]


def test_safe_cluster_refuses_bob(tmp_path):
    """--disagg --preset safe --context-len 672: Bob's prompt is a 400 context_length_exceeded naming 800 and 672."""
    with ServerProcess(["--disagg", "--preset", "safe", "--context-len", "672", *key_args(LEAK_KEYS)]) as s:
        _, bob, prompt = alice_and_bob(s)
        with pytest.raises(openai.BadRequestError) as refused:
            bob.completions.create(model=MODEL, prompt=prompt, max_tokens=64)
    err = refused.value.body
    assert refused.value.status_code == HTTPStatus.BAD_REQUEST and err["code"] == "context_length_exceeded"
    assert "800" in err["message"] and "672" in err["message"]
