"""What a client may send, checked before anything reaches the engine, and the bodies sent back.

Errors come in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with a real
status, so a client library sees what it sees from OpenAI, vLLM or SGLang and can read `code`.

Types are checked here (pydantic, strict: `"max_tokens": "7"` is an error, not a 7); values
are checked by the engine's own admission (`max_tokens` <= 0, `top_p` of 3, an over-length
prompt), so the HTTP server and the in-process API refuse the same requests with the same words.
Fields that would change the answer and that this server does not implement (`logprobs`, `echo`,
`best_of`, `tools`, ...) are refused with a 400 naming the field; fields that change nothing of
the answer (`user`, `metadata`, ...) are accepted and ignored, as clients send them freely.
"""

from __future__ import annotations

import re
import time
from http import HTTPStatus
from typing import Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from minikv.engine.request import Request, Usage
from minikv.model.sampling import SamplingParams

MAX_STOP_STRINGS = 4  # as OpenAI's API
UNSUPPORTED = {  # field -> the values that ask for nothing (a client's default): anything else is refused
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
    "suffix": (None, ""), "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none"),
    "functions": (None, []), "function_call": (None, "none"), "response_format": (None, {"type": "text"}),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
}
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)
    include_usage: StrictBool = False


class SamplingFields(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(strict=True, extra="allow")
    model: StrictStr
    max_tokens: StrictInt | None = None
    temperature: float | None = None  # None: the engine's default, greedy (SamplingParams)
    top_p: float | None = None
    seed: StrictInt | None = Field(None, le=2**64 - 1)  # torch seeds are 64-bit unsigned; the engine checks >= 0
    stop: StrictStr | list[StrictStr] | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    cache_salt: StrictStr | None = Field(None, max_length=256)  # validated like any input (see docs/serve.md)

    def unsupported(self) -> str | None:
        """The first field sent that would change the answer and that this server does not implement."""
        sent = self.model_extra or {}
        for name, neutral in UNSUPPORTED.items():
            if name in sent and sent[name] not in neutral:
                return name
        return "stream_options" if self.stream_options is not None and not self.stream else None

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(SamplingFields):
    """POST /v1/completions."""

    prompt: StrictStr | list[StrictStr]


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "user", "assistant", "developer"]
    content: StrictStr


class ChatBody(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None  # the newer name for max_tokens


def chat_prompt(messages: list[ChatMessage]) -> str:
    """The shipped model's chat template: each message's text on its own line.

    The model was trained on one line per request (`alice: save pin 0912.\\n`), so a single
    user message is sent as exactly that line. Roles carry no tokens: there are none to carry
    them in a character-level vocabulary, and no text a client sends becomes a control token.
    """
    return "".join(m.content if m.content.endswith("\n") else m.content + "\n" for m in messages)


def completion_prompt(body: CompletionBody) -> str | None:
    """The one prompt string, or None when the body holds several (unsupported: n=1 only)."""
    if isinstance(body.prompt, str):
        return body.prompt
    return body.prompt[0] if len(body.prompt) == 1 else None


def to_request(body: SamplingFields, prompt: str, tenant: str, max_tokens: int | None) -> Request:
    """The engine's Request. Values are not judged here: the engine's admission does that."""
    given = {"temperature": body.temperature, "top_p": body.top_p, "seed": body.seed}
    sampling = SamplingParams(**{k: v for k, v in given.items() if v is not None})
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    return Request(prompt, tenant, max_tokens, sampling, cache_salt=body.cache_salt, stop=tuple(body.stop_strings()))


# --- reply bodies ---------------------------------------------------------------------------

def usage_body(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def completion_body(api_id: str, model: str, chat: bool, text: str, finish_reason: str | None,
                    usage: dict, created: int | None = None) -> dict:
    """A whole (non-streamed) reply."""
    created = created or int(time.time())
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish_reason}
        return {"id": api_id, "object": "chat.completion", "created": created, "model": model, "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {"id": api_id, "object": "text_completion", "created": created, "model": model, "choices": [choice], "usage": usage}


def chunk_body(api_id: str, model: str, chat: bool, created: int, text: str | None,
               finish_reason: str | None = None, usage: dict | None = None, first: bool = False) -> dict:
    """One server-sent event of a streamed reply; `text=None` with `usage` is the usage-only chunk."""
    if chat:
        delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text is not None else {})
        choices = [] if text is None and usage is not None else [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
        obj = "chat.completion.chunk"
    else:
        choices = [] if text is None and usage is not None else [
            {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}]
        obj = "text_completion"
    out = {"id": api_id, "object": obj, "created": created, "model": model, "choices": choices}
    if usage is not None:
        out["usage"] = usage
    return out


# --- errors --------------------------------------------------------------------------------
REQUEST_FIELDS = ("max_tokens", "temperature", "top_p", "seed", "stop", "cache_salt", "prompt", "messages", "n")


class APIError(Exception):
    """A request the server answers with an error body instead of a completion."""

    def __init__(self, status: HTTPStatus, message: str, code: str | None = None, param: str | None = None,
                 kind: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.kind = kind or ("server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=int(self.status))


def engine_refusal(status: int, reason: str, prompt_tokens: int) -> APIError:
    """The error for a response the engine (or the cluster) did not serve.

    A 400 that counted the prompt (prompt_tokens > 0) is a length refusal: the prompt, or the
    prompt plus max_tokens, does not fit what the engine can hold. The engine's reason names
    both numbers and is passed on unchanged.
    """
    if status == HTTPStatus.BAD_REQUEST:
        if prompt_tokens > 0:
            return APIError(HTTPStatus.BAD_REQUEST, reason, "context_length_exceeded", "prompt")
        param = next((w for w in re.findall(r"\w+", reason)[:2] if w in REQUEST_FIELDS), None)  # "max_tokens must", "empty prompt"
        return APIError(HTTPStatus.BAD_REQUEST, reason, "invalid_value", param)
    if status == 499:
        return APIError(HTTPStatus.BAD_REQUEST, reason, "cancelled")
    if status == HTTPStatus.SERVICE_UNAVAILABLE:  # a worker of the distributed pair is down, or shutdown
        return APIError(HTTPStatus.SERVICE_UNAVAILABLE, reason, "unavailable")
    return APIError(HTTPStatus.INTERNAL_SERVER_ERROR, reason or "the engine failed this request", "engine_error")
