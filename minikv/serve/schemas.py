"""What a client may send, checked (pydantic, strict: `"max_tokens": "7"` is an error, not a 7) before
anything reaches the engine, whose own admission judges the values; the replies and errors sent back
(docs/serve.md)."""

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
DEFAULT_CHAT_MAX_TOKENS = 64


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)
    include_usage: StrictBool = False


class SamplingFields(BaseModel):
    """Fields both endpoints share; unknown ones that change nothing of the answer (`user`...) are ignored."""

    model_config = ConfigDict(strict=True, extra="allow")
    model: StrictStr
    max_tokens: StrictInt | None = None
    temperature: float | None = None  # None: the engine's default, greedy (SamplingParams)
    top_p: float | None = None
    seed: StrictInt | None = Field(None, le=2**64 - 1)  # torch's seeds are 64-bit; the engine checks >= 0
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


def check_prompt_size(data: dict, context_len: int, max_chars: int | None) -> None:
    """Before any of the schema's work: at most `context_len - 1` chat messages (each is a line: a token at
    least) and at most `max_chars` characters of prompt in all; 400 context_length_exceeded otherwise."""
    messages, prompt = data.get("messages"), data.get("prompt")
    if isinstance(messages, list) and len(messages) > context_len - 1:
        raise APIError(f"{len(messages):,} messages are at least {len(messages):,} tokens; the context "
                       f"window is {context_len} tokens (prompt + output)", "context_length_exceeded",
                       "messages")
    if isinstance(messages, list):
        texts = [m.get("content") for m in messages if isinstance(m, dict)]
    else:
        texts = prompt if isinstance(prompt, list) else [prompt]
    size = sum(len(t) for t in texts if isinstance(t, str))
    if max_chars is not None and size > max_chars:
        raise APIError(f"the prompt has {size:,} characters, more than {max_chars:,} (four context windows "
                       f"of {context_len} tokens)", "context_length_exceeded",
                       "messages" if isinstance(messages, list) else "prompt")


def check_model(asked: str, served: str) -> None:
    """404 unless `asked` is the model this server serves."""
    if asked != served:
        raise APIError(f"the model {asked[:100]!r} does not exist; this server serves {served!r}",
                       "model_not_found", "model", HTTPStatus.NOT_FOUND)


def to_request(body: SamplingFields, tenant: str, model: str) -> Request:
    """The engine's Request, after the checks the engine cannot make (model, n, stops, unsupported fields)."""
    check_model(body.model, model)
    if body.n != 1:
        raise APIError(f"n must be 1 (one choice per request), got {body.n}", "invalid_value", "n")
    if field := body.unsupported():
        raise APIError(f"{field} is not supported by this server (remove it, or send it empty)",
                       "unsupported_parameter", field)
    stops = [s for s in ([body.stop] if isinstance(body.stop, str) else body.stop or []) if s]
    if len(stops) > MAX_STOP_STRINGS:
        raise APIError(f"stop takes at most {MAX_STOP_STRINGS} strings", "invalid_value", "stop")
    if isinstance(body, ChatBody):  # the chat template: each message's text on a line; roles carry no tokens
        prompt = "".join(m.content if m.content.endswith("\n") else m.content + "\n" for m in body.messages)
        default = DEFAULT_CHAT_MAX_TOKENS
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    elif isinstance(body.prompt, str) or len(body.prompt) == 1:
        prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
        default, max_tokens = DEFAULT_MAX_TOKENS, body.max_tokens
    else:
        raise APIError("prompt must be one string (batches of prompts are not served)", "invalid_value",
                       "prompt")
    given = {"temperature": body.temperature, "top_p": body.top_p, "seed": body.seed}
    sampling = SamplingParams(**{k: v for k, v in given.items() if v is not None})
    max_tokens = default if max_tokens is None else max_tokens
    return Request(prompt, tenant, max_tokens, sampling, cache_salt=body.cache_salt, stop=tuple(stops))


def reply_body(api_id: str, model: str, chat: bool, created: int, text: str | None,
               finish_reason: str | None = None, usage: Usage | None = None, stream: bool = True,
               first: bool = False) -> dict:
    """A whole reply, or one event of a stream (`first` gives a chat's role; `text=None` is the usage)."""
    if not chat:
        content = {"text": text}
    elif stream:
        content = {"delta": ({"role": "assistant"} if first else {}) | {"content": text}}
    else:
        content = {"message": {"role": "assistant", "content": text}}
    kind = ("chat.completion" if chat else "text_completion") + (".chunk" if chat and stream else "")
    choice = {"index": 0, **content, "logprobs": None, "finish_reason": finish_reason}
    choices = [] if text is None else [choice]
    body = {"id": api_id, "object": kind, "created": created, "model": model, "choices": choices}
    if usage is not None:
        body["usage"] = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                         "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                         "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}
    return body


class APIError(Exception):
    """A request the server answers with an error body (OpenAI's shape), 400 unless told, not a completion."""

    def __init__(self, message: str, code: str | None = None, param: str | None = None,
                 status: HTTPStatus = HTTPStatus.BAD_REQUEST, kind: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.kind = kind or ("server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=int(self.status))


def engine_refusal(status: int, reason: str, code: str | None = None, param: str | None = None) -> APIError:
    """The error for a response the engine did not serve, with the code and param the engine gave. An empty
    `reason` gets the status's own words."""
    if status == HTTPStatus.BAD_REQUEST:
        what = "this prompt's length" if code == "context_length_exceeded" else "this request"
        return APIError(reason or f"the engine refused {what}", code or "invalid_value", param)
    if status == 499:
        return APIError(reason or "cancelled by the client", "cancelled")
    if status == HTTPStatus.SERVICE_UNAVAILABLE:  # a worker of the distributed pair is down, or shutdown
        return APIError(reason or "the server cannot serve now", "unavailable", status=status)
    return APIError(reason or "the engine failed this request", "engine_error",
                    status=HTTPStatus.INTERNAL_SERVER_ERROR)
