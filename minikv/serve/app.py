"""The HTTP routes, OpenAI-compatible as vLLM's and SGLang's, and bearer keys to tenants (docs/serve.md).
Every call goes to the gateway log; a bad request ends with an error in OpenAI's shape; a prompt is checked
and tokenized on a worker thread, never on the event loop."""

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from minikv.engine.front_door import Rejected, check_at_door
from minikv.engine.request import Request, Response as Answer
from minikv.serve.connections import BODY_TIMEOUT_S
from minikv.serve.engine_loop import EngineLoop, Ticket
from minikv.serve.gateway import Call, GatewayLog
from minikv.serve.schemas import (APIError, ChatBody, CompletionBody, SamplingFields, check_model,
                                  check_prompt_size, engine_refusal, reply_body, to_request)

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: a thousand times the shipped model's context window
DISCONNECT_POLL_S = 0.25  # how often a waiting handler checks whether its client is still there
ANONYMOUS = "anon"  # every caller's tenant when the server was started without keys


@dataclass(frozen=True)
class ServerSettings:
    """What the routes need to know besides the engine loop."""

    model_name: str
    context_len: int  # advertised as max_model_len
    api_keys: dict[str, str]  # key -> tenant; empty: everyone is tenant "anon"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    admin_key: str | None = None  # the operator's key: /health shows it what every tenant is doing
    max_prompt_chars: int | None = None  # longer prompts: refused before the schema's work (None: no bound)
    engine_reasons: bool = True  # False (--mystery): the engine's refusals say only their status's words


def tenant_for(authorization: str | None, keys: dict[str, str]) -> str:
    """The tenant this Authorization header's key belongs to (never anything in the body), or a 401."""
    if not keys:
        return ANONYMOUS
    scheme, _, key = (authorization or "").partition(" ")
    tenant = keys.get(key.strip()) if scheme.lower() == "bearer" else None
    if tenant is None:
        missing = "missing API key: send 'Authorization: Bearer <key>'"
        raise APIError("incorrect API key provided" if authorization else missing, "invalid_api_key",
                       status=HTTPStatus.UNAUTHORIZED, kind="authentication_error")
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
    card = {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "minikv",
            "max_model_len": settings.context_len}

    async def error_response(_: HTTPRequest, e: Exception) -> JSONResponse:
        """Every error in OpenAI's shape: ours, Starlette's (unknown route, wrong method), a bug's (500)."""
        if isinstance(e, StarletteHTTPException):
            e = APIError(str(e.detail), status=HTTPStatus(e.status_code))
        elif not isinstance(e, APIError):
            e = APIError(f"internal error: {type(e).__name__}", "internal_error",
                         status=HTTPStatus.INTERNAL_SERVER_ERROR)
        return e.response()

    for error in (APIError, StarletteHTTPException, Exception):
        app.add_exception_handler(error, error_response)

    @app.get("/health")
    async def health(http: HTTPRequest) -> JSONResponse:
        """Liveness for anyone; pages, requests, steps, workers (every tenant's activity) for the operator."""
        stats = loop.stats()
        down = stats.get("failure")  # set when the core (or a worker of the distributed pair) died or stalled
        key = settings.admin_key
        operator = key is not None and http.headers.get("authorization") == f"Bearer {key}"
        body = {"status": "unavailable" if down else "ok"}
        body |= {"model": settings.model_name, **stats} if operator else {}
        return JSONResponse(body, status_code=HTTPStatus.SERVICE_UNAVAILABLE if down else HTTPStatus.OK)

    @app.get("/v1/models")
    @app.get("/v1/models/{model_id:path}")
    async def models(http: HTTPRequest, model_id: str | None = None) -> dict:
        """The list, or the card of the model named in the path (404 for any other)."""
        tenant_for(http.headers.get("authorization"), settings.api_keys)
        if model_id is None:
            return {"object": "list", "data": [card]}
        check_model(model_id, settings.model_name)
        return card

    @app.post("/v1/completions")
    @app.post("/v1/chat/completions")
    async def completions(http: HTTPRequest) -> Response:
        return await serve_call(http, http.url.path == "/v1/chat/completions", loop, settings, gateway)

    return app


async def serve_call(http: HTTPRequest, chat: bool, loop: EngineLoop, settings: ServerSettings,
                     gateway: GatewayLog) -> Response:
    """One completion call: key, body, the engine's answer (whole or streamed), and its gateway record."""
    call = Call(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", settings.model_name)
    try:
        call.account = tenant_for(http.headers.get("authorization"), settings.api_keys)
        raw = await read_body(http, settings.max_body_bytes)
        try:  # one hop to a worker thread: each hop waits for the interpreter lock beside the engine's thread
            body, request, prompt_ids = await run_in_threadpool(intake, raw, chat, call.account, loop,
                                                                settings)
        except Rejected as e:
            call.prompt_tokens = e.prompt_tokens
            raise engine_refusal(HTTPStatus.BAD_REQUEST, e.reason, e.code, e.param) from None
    except APIError as e:
        gateway.write(call, e.status)
        return e.response()
    except ClientDisconnect:  # the client left while sending its body: nothing to answer
        gateway.write(call, 499)
        return Response(status_code=499)
    call.prompt_tokens = len(prompt_ids)  # what a 499 row records if the client leaves before the answer
    ticket = Ticket(request, body.stream, asyncio.get_running_loop(), prompt_ids=prompt_ids)
    loop.submit(ticket)
    first = await next_update(ticket, http)  # without streaming, the loop sends the Answer alone
    if first is None:  # the client left before the reply was ready
        loop.cancel(ticket)
        gateway.write(call, 499, ticket.tokens_seen)
        return Response(status_code=499)
    if isinstance(first, Answer) and (first.status != HTTPStatus.OK or not body.stream):
        if await http.is_disconnected():  # it left (or half-closed: TCP shows a FIN either way)
            gateway.write(call, 499, first.usage.completion_tokens)
            return Response(status_code=499)
        log_answer(gateway, call, first)
        if first.status != HTTPStatus.OK:
            return refusal(first, settings).response()
        return JSONResponse(reply_body(call.request_id, settings.model_name, chat, int(time.time()),
                                       first.text, first.finish_reason, first.usage, stream=False))
    events = stream_events(ticket, first, call, chat, body, loop, gateway, settings)
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def read_body(http: HTTPRequest, limit: int) -> bytes:
    """The raw body; 413 once over `limit` bytes, 408 unless whole within BODY_TIMEOUT_S (a client that sends
    its body a byte at a time holds a connection no longer than that)."""
    chunks, size = [], 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in http.stream():
                size += len(chunk)
                if size > limit:
                    raise APIError(f"request body exceeds the limit of {limit:,} bytes", "request_too_large",
                                   status=HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
                chunks.append(chunk)
    except TimeoutError:
        raise APIError(f"the request body did not arrive whole within {BODY_TIMEOUT_S:g} s ({size:,} bytes "
                       "came)", "request_timeout", status=HTTPStatus.REQUEST_TIMEOUT) from None
    return b"".join(chunks)


def intake(raw: bytes, chat: bool, tenant: str, loop: EngineLoop,
           settings: ServerSettings) -> tuple[SamplingFields, Request, list[int]]:
    """A call's body parsed and validated, its Request built and checked at the door (the prompt's token ids):
    all of it on one worker thread, never on the event loop. Raises APIError or Rejected."""
    body = parse_body(raw, ChatBody if chat else CompletionBody, settings)
    request = to_request(body, tenant, settings.model_name)
    return body, request, check_at_door(request, loop.tokenizer, settings.context_len, loop.chars_per_token)


def parse_body(raw: bytes, schema: type[BaseModel], settings: ServerSettings) -> SamplingFields:
    """The body in the endpoint's schema, its size checked before the schema's work; 400 naming the first
    problem. Seconds of work for a megabyte of small messages: run on a worker thread, never the loop."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        detail = f": {e.msg} (column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
        raise APIError(f"the body is not valid JSON{detail}", "invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(f"the body must be a JSON object, not {type(data).__name__}", "invalid_json")
    check_prompt_size(data, settings.context_len, settings.max_prompt_chars)
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise APIError(f"{where or 'body'}: {first['msg']}", "invalid_type",
                       str(first["loc"][0]) if first["loc"] else None) from None


async def next_update(ticket: Ticket, http: HTTPRequest) -> str | Answer | None:
    """The next text delta or the Answer; None if the client left (the caller cancels the request)."""
    while True:
        try:
            return await asyncio.wait_for(ticket.updates.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await http.is_disconnected():
                return None


def refusal(answer: Answer, settings: ServerSettings) -> APIError:
    """The error for an answer the engine did not serve: its reason, or (no `engine_reasons`) its status's."""
    return engine_refusal(answer.status, answer.error or "" if settings.engine_reasons else "",
                          answer.error_code, answer.error_param)


def log_answer(gateway: GatewayLog, call: Call, answer: Answer) -> None:
    call.prompt_tokens = answer.usage.prompt_tokens
    gateway.write(call, answer.status, answer.usage.completion_tokens, answer.ttft_s, answer.text)


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


async def stream_events(ticket: Ticket, first: str | Answer, call: Call, chat: bool, body: SamplingFields,
                        loop: EngineLoop, gateway: GatewayLog,
                        settings: ServerSettings) -> AsyncIterator[str]:
    """Server-sent events: a chunk per text delta, the finish reason, usage if asked, [DONE]. If the client
    leaves, Starlette cancels this generator: `finally` cancels the request (its pages freed next step)."""
    created, sent, outcome = int(time.time()), [], None
    item: str | Answer = first
    try:
        while isinstance(item, str):
            while not ticket.updates.empty():  # deltas that queued up while this one waited: one event
                following = ticket.updates.get_nowait()
                if not isinstance(following, str):
                    ticket.updates.put_nowait(following)  # an Answer: after this event  (the queue was empty)
                    break
                item += following
            yield sse(reply_body(call.request_id, call.model, chat, created, item, first=not sent))
            sent.append(item)
            item = await ticket.updates.get()
        outcome = item
        log_answer(gateway, call, outcome)  # logged before the last event goes out
        if outcome.status != HTTPStatus.OK:  # failed after the first token: an error event, as vLLM sends
            yield sse(refusal(outcome, settings).body())
        else:
            yield sse(reply_body(call.request_id, call.model, chat, created, "", outcome.finish_reason,
                                 first=not sent))
            if body.stream_options is not None and body.stream_options.include_usage:
                yield sse(reply_body(call.request_id, call.model, chat, created, None, usage=outcome.usage))
        yield sse("[DONE]")
    finally:
        if outcome is None:  # the client went away mid-stream
            loop.cancel(ticket)
            gateway.write(call, 499, ticket.tokens_seen, None, "".join(sent))
