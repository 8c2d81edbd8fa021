"""Bodies are parsed and validated off the event loop, their size bounded before that work (docs/serve.md)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import types

import httpx
import pytest

from minikv.serve.app import ServerSettings, create_app
from minikv.serve.gateway import GatewayLog
from minikv.serve.schemas import ChatBody

CONTEXT = 1024
WAIT_S = 2.0  # how long the validation waits to see the event loop move


def app_client() -> httpx.AsyncClient:
    """The real routes over no engine: each request here is refused before it would reach one."""
    settings = ServerSettings("tiny-llama", CONTEXT, {}, max_prompt_chars=4 * CONTEXT)
    app = create_app(types.SimpleNamespace(), settings, GatewayLog(None))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def chat(messages: int, model: str = "another-model") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "a"}] * messages}


def test_the_loop_runs_while_a_body_is_validated(monkeypatch):
    """While the schema validates a chat body, another task on the event loop keeps running: validation waits
    (at most 2 s) until it has seen the loop tick. On the loop itself it could never see one."""
    ticks, seen = [0], []
    validate = ChatBody.model_validate

    def watched(data, *a, **kw):
        start = ticks[0]
        deadline = time.monotonic() + WAIT_S
        while ticks[0] == start and time.monotonic() < deadline:
            time.sleep(0.001)
        seen.append((ticks[0] - start, threading.current_thread() is threading.main_thread()))
        return validate(data, *a, **kw)

    monkeypatch.setattr(ChatBody, "model_validate", watched)

    async def run() -> httpx.Response:
        async def probe() -> None:
            while True:
                ticks[0] += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(probe())
        async with app_client() as c:
            r = await c.post("/v1/chat/completions", json=chat(500))
        task.cancel()
        return r

    r = asyncio.run(run())
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"  # validated, then refused
    assert len(seen) == 1 and seen[0][0] > 0 and not seen[0][1], seen


LONG_CHAT = {"model": "m", "messages": [{"role": "user", "content": "a" * 5000}]}


@pytest.mark.parametrize("body,param", [(chat(30_000), "messages"), (LONG_CHAT, "messages"),
                                        ({"model": "m", "prompt": "a" * 5000}, "prompt")])
def test_oversized_prompts_are_refused_before_validation(monkeypatch, body, param):
    """30,000 messages, or more characters than four windows: 400 context_length_exceeded, never validated."""
    validated = []
    monkeypatch.setattr(ChatBody, "model_validate", lambda *a, **kw: validated.append(1))

    async def run() -> httpx.Response:
        async with app_client() as c:
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            return await c.post(path, content=json.dumps(body))

    r = asyncio.run(run())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded" and r.json()["error"]["param"] == param
    assert not validated
