"""What the probe reads back: an Observation per request, every field checked against the OpenAI API; a reply
the API does not allow raises CannotProbe (a malformed endpoint is never a FAIL)."""

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

NO_DONE = "its streams end after the final chunk (finish_reason and usage) without `data: [DONE]`"
NO_CACHED_TOKENS = "its usage has no prompt_tokens_details.cached_tokens"
JSON_KINDS = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "a boolean"}


class CannotProbe(Exception):
    """The endpoint cannot be probed (unreachable, keys refused, a malformed reply, ...)."""


@dataclass(frozen=True)
class Observation:
    """What came back for one request."""

    status: int
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None  # sending -> first text; None when no text came
    latency_s: float = 0.0
    error_code: str | None = None
    error_message: str | None = None
    text_times: tuple[float, ...] = ()  # time.perf_counter() at each event that carried text
    quirks: tuple[str, ...] = ()  # what the API allows but this reply left out (NO_DONE, NO_CACHED_TOKENS)

    @property
    def first_token_s(self) -> float:
        """Time to first token, or to the whole reply when no text came (it ended at once)."""
        return self.ttft_s if self.ttft_s is not None else self.latency_s

    def summary(self) -> str:
        """One line for the report, without the reply's text."""
        if self.status != HTTPStatus.OK:
            head = " ".join(str(x) for x in (self.status, self.error_code) if x)
            return f"{head}: {self.error_message or '(no message)'}"
        ttft = f"{self.ttft_s * 1e3:.1f} ms" if self.ttft_s is not None else "-"
        return f"200, prompt_tokens={self.prompt_tokens}, cached_tokens={self.cached_tokens}, ttft {ttft}"


@dataclass
class StreamControl:
    """For a stream read on another thread: `first_text` is set when its first text arrives; set
    `stop` to leave the stream at its next event (the server then sees the client go)."""

    first_text: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)


def one_line(text: str, limit: int = 300) -> str:
    """An error as one short line: tags dropped (an HTML error page), whitespace collapsed."""
    return " ".join(re.sub(r"<[^>]*>", " ", text).split())[:limit]


def lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Lines of a byte stream (LF or CRLF), decoded leniently."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if pending:
        yield pending.decode("utf-8", "replace")


def error_observation(status: int, error: object, latency_s: float, text: str = "") -> Observation:
    """A failed request: the code and message of an API error object, or the error itself as one line."""
    code, message = None, error if isinstance(error, str) else json.dumps(error)
    if isinstance(error, dict):
        code, message = error.get("code"), str(error.get("message"))
    return Observation(status, text, latency_s=latency_s, error_code=None if code is None else str(code),
                       error_message=one_line(message))


def error_body(chunks: Iterator[bytes], limit: int = 4096) -> object:
    """The `error` of a JSON error body, or the body as text; only its first `limit` bytes are read."""
    content = b""
    for chunk in chunks:
        content += chunk
        if len(content) >= limit:
            break
    try:
        return json.loads(content[:limit])["error"]
    except (ValueError, KeyError, TypeError):
        return content[:limit].decode("utf-8", "replace")


def read_stream(stream_lines: Iterator[str], start: float, content_type: str | None,
                control: StreamControl | None = None) -> Observation:
    """A completion's server-sent events -> one Observation; CannotProbe if they are not the API's. The probe
    always asks for usage: a stream without `[DONE]` is whole only if it carried a finish_reason and usage."""
    text, times, usage, events, done, finished = [], [], None, 0, False, False
    for line in stream_lines:
        if not line.startswith("data:"):
            continue  # comments (keep-alives), event names, blank separators
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        event = _event(data)
        events += 1
        if "error" in event:
            return error_observation(HTTPStatus.INTERNAL_SERVER_ERROR, event["error"], time.perf_counter() - start,
                                     "".join(text))
        for choice in _field(event, "choices", list) or []:
            if not isinstance(choice, dict):
                raise CannotProbe(f"a choice is {JSON_KINDS.get(type(choice), 'null')}, not an object")
            if piece := _field(choice, "text", str):
                times.append(time.perf_counter())
                text.append(piece)
                if control is not None:
                    control.first_text.set()
            finished = finished or _field(choice, "finish_reason", str) is not None
        usage = _field(event, "usage", dict) or usage
        if control is not None and control.stop.is_set():
            done = True
            break
    if not events:
        raise CannotProbe(f"answered 200 with no server-sent events (content-type {content_type!r})")
    if not done and not (finished and usage is not None):
        raise CannotProbe("a completion stream ended before its final chunk (a finish_reason and usage) and "
                          "without `data: [DONE]` (cut short)")
    return _observation("".join(text), usage or {}, start, times, () if done else (NO_DONE,))


def _observation(text: str, usage: dict, start: float, times: list[float], quirks: tuple[str, ...]) -> Observation:
    """A whole stream's Observation; CannotProbe if its usage is inconsistent (more cached than sent)."""
    details = _field(usage, "prompt_tokens_details", dict) or {}
    prompt, cached = _count(usage, "prompt_tokens"), _count(details, "cached_tokens")
    if prompt is not None and cached is not None and cached > prompt:
        raise CannotProbe(f"usage reports {cached} cached_tokens of {prompt} prompt_tokens: the endpoint's numbers "
                          "are inconsistent")
    if prompt is not None and cached is None:
        quirks += (NO_CACHED_TOKENS,)
    return Observation(HTTPStatus.OK, text, prompt, _count(usage, "completion_tokens"), cached,
                       times[0] - start if times else None, time.perf_counter() - start, text_times=tuple(times),
                       quirks=quirks)


def _event(data: str) -> dict:
    try:
        event = json.loads(data)
    except ValueError:
        raise CannotProbe(f"a server-sent event is not JSON: {one_line(data, 60)!r}") from None
    if not isinstance(event, dict):
        raise CannotProbe(f"a server-sent event is {JSON_KINDS.get(type(event), 'null')}, not an object")
    return event


def _field(obj: dict, name: str, kind: type) -> Any:
    """obj[name] if it is a `kind`, None if absent or null; CannotProbe if it is anything else."""
    value = obj.get(name)
    if value is not None and not isinstance(value, kind):
        raise CannotProbe(f"{name} is {JSON_KINDS.get(type(value))}, not {JSON_KINDS[kind]}")
    return value


def _count(usage: dict, name: str) -> int | None:
    """A token count from usage: a whole number >= 0, or None if absent; CannotProbe otherwise."""
    value = usage.get(name)
    if value is not None and (type(value) is not int or value < 0):
        raise CannotProbe(f"usage.{name} is {value!r}, not a token count")
    return value
