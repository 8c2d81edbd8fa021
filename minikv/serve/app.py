"""The HTTP routes, OpenAI-compatible, as vLLM and SGLang serve them.

    POST /v1/completions        {"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop",
    POST /v1/chat/completions    "stream", "stream_options", "cache_salt"} or "messages" instead of "prompt"
    GET  /v1/models[/{id}]      the one model, with its context window as `max_model_len`
    GET  /health                liveness for anyone; pools, requests and workers for the operator's key

Every call, served or refused, is written to the gateway log. A bad request ends itself with an
error in OpenAI's shape; nothing a client sends can stop the engine loop. A prompt is checked and
tokenized on a thread of this process, never on the engine loop's: one huge prompt delays no one.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from http import HTTPStatus

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from minikv.engine.front_door import Rejected, check_at_door
from minikv.engine.request import Request
from minikv.engine.request import Response as Answer
from minikv.serve.engine_loop import EngineLoop, Ticket
from minikv.serve.gateway import CallRecord, GatewayLog
from minikv.serve.schemas import (
    MAX_STOP_STRINGS, APIError, ChatBody, CompletionBody, SamplingFields, chat_prompt, chunk_body, completion_body,
    completion_prompt, engine_refusal, to_request, usage_body,
)

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: a thousand times the shipped model's context window
DISCONNECT_POLL_S = 0.25  # how often a waiting handler checks whether its client is still there
DEFAULT_CHAT_MAX_TOKENS = 64


@dataclass(frozen=True)
class ServerSettings:
    """What the routes need to know besides the engine loop."""

    model_name: str
    context_len: int  # advertised as max_model_len
    api_keys: dict[str, str]  # key -> tenant; empty: everyone is tenant "anon"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    admin_key: str | None = None  # the operator's key: /health shows it what every tenant is doing


@dataclass
class Call:
    """One completion call as the gateway records it."""

    api_id: str
    arrived: datetime
    arrived_s: float
    chat: bool
    account: str = "-"  # until the key is known
    prompt_tokens: int = 0

    def record(self, model: str, status: int, completion_tokens: int, ttft_s: float | None, text: str) -> CallRecord:
        ttft_ms = 1000 * (ttft_s if ttft_s is not None else time.perf_counter() - self.arrived_s)
        return CallRecord(self.arrived, self.api_id, self.account, model, self.prompt_tokens,
                          completion_tokens, ttft_ms, status, text)


# -- keys: the tenant a request runs as comes from its key, never its body ----------------------
ANONYMOUS = "anon"  # every caller's tenant when the server was started without keys


def parse_api_keys(specs: list[str]) -> dict[str, str]:
    """`TENANT=KEY` strings -> {key: tenant}; ValueError naming the bad one."""
    keys: dict[str, str] = {}
    for spec in specs:
        tenant, sep, key = spec.partition("=")
        if not sep or not tenant or not key:
            raise ValueError(f"--api-key wants TENANT=KEY, got {spec.split('=')[0]!r}=...")
        if key in keys:
            raise ValueError(f"the same key is given to tenants {keys[key]!r} and {tenant!r}")
        keys[key] = tenant
    return keys


def tenant_for(authorization: str | None, keys: dict[str, str]) -> str:
    """The tenant this Authorization header belongs to, or a 401 in OpenAI's shape."""
    if not keys:
        return ANONYMOUS
    if not authorization:
        raise APIError(HTTPStatus.UNAUTHORIZED, "missing API key: send 'Authorization: Bearer <key>'",
                       "invalid_api_key", kind="authentication_error")
    scheme, _, key = authorization.partition(" ")
    tenant = keys.get(key.strip()) if scheme.lower() == "bearer" else None
    if tenant is None:
        raise APIError(HTTPStatus.UNAUTHORIZED, "incorrect API key provided", "invalid_api_key",
                       kind="authentication_error")
    return tenant


def create_app(loop: EngineLoop, settings: ServerSettings, gateway: GatewayLog) -> FastAPI:
    """The FastAPI app around a started-or-not engine loop; the app's lifespan starts and stops it."""

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        loop.start()
        try:
            yield
        finally:
            loop.stop()
            gateway.close()

    app = FastAPI(title="minikv", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(APIError)
    async def api_error(_: HTTPRequest, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: HTTPRequest, e: StarletteHTTPException) -> JSONResponse:
        return APIError(HTTPStatus(e.status_code), str(e.detail), None).response()

    @app.exception_handler(Exception)
    async def unexpected(_: HTTPRequest, e: Exception) -> JSONResponse:
        return APIError(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {type(e).__name__}", "internal_error").response()

    @app.get("/health")
    async def health(http: HTTPRequest) -> JSONResponse:
        """Liveness for anyone; the details (pages held, live requests, steps, workers) only for the
        operator's key: to anyone else they would show every tenant's activity."""
        stats = loop.stats()
        down = stats.get("failure")  # set when a worker of the distributed pair has died or stalled
        operator = settings.admin_key is not None and http.headers.get("authorization") == f"Bearer {settings.admin_key}"
        body = {"status": "unavailable" if down else "ok"} | ({"model": settings.model_name, **stats} if operator else {})
        return JSONResponse(body, status_code=HTTPStatus.SERVICE_UNAVAILABLE if down else HTTPStatus.OK)

    @app.get("/v1/models")
    async def models(http: HTTPRequest) -> dict:
        tenant_for(http.headers.get("authorization"), settings.api_keys)
        return {"object": "list", "data": [model_card(settings)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, http: HTTPRequest) -> dict:
        tenant_for(http.headers.get("authorization"), settings.api_keys)
        if model_id != settings.model_name:
            raise APIError(HTTPStatus.NOT_FOUND, f"the model {model_id[:100]!r} does not exist; this server serves "
                           f"{settings.model_name!r}", "model_not_found", "model")
        return model_card(settings)

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest) -> Response:
        return await serve_call(http, False, loop, settings, gateway)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HTTPRequest) -> Response:
        return await serve_call(http, True, loop, settings, gateway)

    return app


def model_card(settings: ServerSettings) -> dict:
    return {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "minikv",
            "max_model_len": settings.context_len}


async def serve_call(http: HTTPRequest, chat: bool, loop: EngineLoop, settings: ServerSettings,
                     gateway: GatewayLog) -> Response:
    """One completion call: key, body, the engine's answer (whole or streamed), and its gateway record."""
    call = Call(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", datetime.now(timezone.utc),
                time.perf_counter(), chat)
    try:
        call.account = tenant_for(http.headers.get("authorization"), settings.api_keys)
        body = parse_body(await read_body(http, settings.max_body_bytes), ChatBody if chat else CompletionBody)
        request = engine_request(body, call.account, settings)
        door = loop.door  # the door's own checks, on a thread of this process
        prompt_ids = await asyncio.to_thread(check_at_door, request, door.tokenizer, loop.context_len, door.chars_per_token)
    except Rejected as e:
        call.prompt_tokens = e.prompt_tokens
        gateway.write(call.record(settings.model_name, HTTPStatus.BAD_REQUEST, 0, None, ""))
        return engine_refusal(HTTPStatus.BAD_REQUEST, e.reason, e.prompt_tokens).response()
    except APIError as e:
        gateway.write(call.record(settings.model_name, e.status, 0, None, ""))
        return e.response()
    except ClientDisconnect:  # the client left while sending its body: nothing to answer
        gateway.write(call.record(settings.model_name, 499, 0, None, ""))
        return Response(status_code=499)
    ticket = Ticket(request, body.stream, asyncio.get_running_loop(), prompt_ids=prompt_ids)
    loop.submit(ticket)
    first = await next_update(ticket, http)
    if not body.stream and isinstance(first, str):
        first = await whole_outcome(ticket, http)
    if first is None:  # the client left before the reply was ready
        loop.cancel(ticket)
        gateway.write(call.record(settings.model_name, 499, ticket.tokens_seen, None, ""))
        return Response(status_code=499)
    if isinstance(first, Answer) and (first.status != HTTPStatus.OK or not body.stream):
        call.prompt_tokens = first.usage.prompt_tokens
        gateway.write(call.record(settings.model_name, first.status, first.usage.completion_tokens, first.ttft_s, first.text))
        if first.status != HTTPStatus.OK:
            return engine_refusal(first.status, first.error or "", first.usage.prompt_tokens).response()
        usage = usage_body(first.usage)
        return JSONResponse(completion_body(call.api_id, settings.model_name, chat, first.text, first.finish_reason, usage))
    events = stream_events(ticket, first, call, body, settings.model_name, loop, gateway)
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def read_body(http: HTTPRequest, limit: int) -> bytes:
    """The request body, or 413 as soon as it passes `limit` bytes (declared or actually sent)."""
    declared = http.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body of {int(declared):,} bytes exceeds the limit of {limit:,} bytes",
                       "request_too_large")
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body exceeds the limit of {limit:,} bytes", "request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_body(raw: bytes, schema: type[BaseModel]) -> SamplingFields:
    """JSON -> the endpoint's schema, or a 400 naming the first problem and its field."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        detail = f": {e.msg} (column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
        raise APIError(HTTPStatus.BAD_REQUEST, f"the body is not valid JSON{detail}", "invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(HTTPStatus.BAD_REQUEST, f"the body must be a JSON object, not {type(data).__name__}", "invalid_json")
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise APIError(HTTPStatus.BAD_REQUEST, f"{where or 'body'}: {first['msg']}", "invalid_type",
                       str(first["loc"][0]) if first["loc"] else None) from None


def engine_request(body: SamplingFields, tenant: str, settings: ServerSettings) -> Request:
    """Checks the engine cannot make (which model, how many choices, how many stops), then the Request."""
    if body.model != settings.model_name:
        raise APIError(HTTPStatus.NOT_FOUND, f"the model {body.model[:100]!r} does not exist; this server serves "
                       f"{settings.model_name!r}", "model_not_found", "model")
    if body.n != 1:
        raise APIError(HTTPStatus.BAD_REQUEST, f"n must be 1 (one choice per request), got {body.n}", "invalid_value", "n")
    if field := body.unsupported():
        raise APIError(HTTPStatus.BAD_REQUEST, f"{field} is not supported by this server (remove it, or send it empty)",
                       "unsupported_parameter", field)
    if len(body.stop_strings()) > MAX_STOP_STRINGS:
        raise APIError(HTTPStatus.BAD_REQUEST, f"stop takes at most {MAX_STOP_STRINGS} strings", "invalid_value", "stop")
    if isinstance(body, ChatBody):
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        return to_request(body, chat_prompt(body.messages), tenant, DEFAULT_CHAT_MAX_TOKENS if max_tokens is None else max_tokens)
    prompt = completion_prompt(body)
    if prompt is None:
        raise APIError(HTTPStatus.BAD_REQUEST, "prompt must be one string (batches of prompts are not served)", "invalid_value", "prompt")
    return to_request(body, prompt, tenant, body.max_tokens)


async def next_update(ticket: Ticket, http: HTTPRequest) -> str | Answer | None:
    """The next text delta or the Answer; None if the client left (the caller cancels the request)."""
    while True:
        try:
            return await asyncio.wait_for(ticket.updates.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await http.is_disconnected():
                return None


async def whole_outcome(ticket: Ticket, http: HTTPRequest) -> Answer | None:
    """Wait for the Answer, skipping text deltas; None if the client left."""
    while True:
        item = await next_update(ticket, http)
        if item is None or isinstance(item, Answer):
            return item


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


async def stream_events(ticket: Ticket, first: str | Answer, call: Call, body: SamplingFields, model: str,
                        loop: EngineLoop, gateway: GatewayLog) -> AsyncIterator[str]:
    """Server-sent events: one chunk per text delta, the finish reason, usage if asked, [DONE].

    If the client disconnects, Starlette cancels this generator: the `finally` cancels the
    engine request, so its pages are freed at the next step.
    """
    created, sent, outcome = int(time.time()), [], None
    item: str | Answer = first
    try:
        while True:
            if isinstance(item, Answer):
                outcome = item
                call.prompt_tokens = outcome.usage.prompt_tokens  # logged before the last event goes out
                gateway.write(call.record(model, outcome.status, outcome.usage.completion_tokens, outcome.ttft_s, outcome.text))
                break
            while not ticket.updates.empty():  # deltas that queued up while this one waited: one event
                following = ticket.updates.get_nowait()
                if not isinstance(following, str):
                    ticket.updates.put_nowait(following)  # an Answer: after this event  (the queue was empty)
                    break
                item += following
            yield sse(chunk_body(call.api_id, model, call.chat, created, item, first=not sent))
            sent.append(item)
            item = await ticket.updates.get()
        if outcome.status != HTTPStatus.OK:  # failed after the first token: an error event, as vLLM sends
            yield sse(engine_refusal(outcome.status, outcome.error or "", outcome.usage.prompt_tokens).body())
        else:
            yield sse(chunk_body(call.api_id, model, call.chat, created, "", outcome.finish_reason, first=not sent))
            if body.include_usage():
                usage = usage_body(outcome.usage)
                yield sse(chunk_body(call.api_id, model, call.chat, created, None, usage=usage))
        yield sse("[DONE]")
    finally:
        if outcome is None:  # the client went away mid-stream
            loop.cancel(ticket)
            gateway.write(call.record(model, 499, ticket.tokens_seen, None, "".join(sent)))
