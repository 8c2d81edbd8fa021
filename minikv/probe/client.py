"""The probe's HTTP client: one streaming completion at a time, timed, within a budget.

Time to first token is measured the way a customer's gateway measures it: from sending the
request to the first server-sent event that carries text.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from http import HTTPStatus

import httpx

REQUEST_TIMEOUT_S = 60.0


class CannotProbe(Exception):
    """The endpoint cannot be probed (unreachable, keys refused, no usage reported, ...)."""


class OutOfBudget(Exception):
    """The request budget or the time limit is spent."""


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

    @property
    def first_token_s(self) -> float:
        """Time to first token, or to the whole reply when no text came (it ended at once)."""
        return self.ttft_s if self.ttft_s is not None else self.latency_s

    def summary(self) -> str:
        """One line for the report, without the reply's text."""
        if self.status != HTTPStatus.OK:
            return f"{self.status} {self.error_code or ''}: {self.error_message or ''}".strip()
        ttft = f"{self.ttft_s * 1e3:.1f} ms" if self.ttft_s is not None else "-"
        return f"200, prompt_tokens={self.prompt_tokens}, cached_tokens={self.cached_tokens}, ttft {ttft}"


def api_base(url: str) -> str:
    """`http://host:port`, `.../v1` or `.../v1/` -> `.../v1`."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class ProbeClient:
    """Sends at most `budget` requests and none after `time_limit_s`."""

    def __init__(self, url: str, budget: int, time_limit_s: float, transport: httpx.BaseTransport | None = None) -> None:
        self.base = api_base(url)
        self.budget, self.sent = budget, 0
        self.deadline = time.monotonic() + time_limit_s
        self.model: str | None = None
        self.http = httpx.Client(timeout=REQUEST_TIMEOUT_S, transport=transport)

    def close(self) -> None:
        self.http.close()

    def _spend(self) -> None:
        if self.sent >= self.budget:
            raise OutOfBudget(f"the request budget of {self.budget} is spent")
        if time.monotonic() > self.deadline:
            raise OutOfBudget("the time limit is reached")
        self.sent += 1

    def models(self, key: str) -> list[dict]:
        """GET /v1/models with `key`; CannotProbe if unreachable or refused."""
        self._spend()
        try:
            r = self.http.get(f"{self.base}/models", headers={"Authorization": f"Bearer {key}"})
        except httpx.HTTPError as e:
            raise CannotProbe(f"cannot reach {self.base}: {type(e).__name__}") from None
        if r.status_code != HTTPStatus.OK:
            raise CannotProbe(f"GET {self.base}/models answered {r.status_code} for key {mask(key)}")
        try:
            return list(r.json()["data"])
        except (ValueError, KeyError, TypeError):
            raise CannotProbe(f"GET {self.base}/models did not return a model list") from None

    def complete(self, key: str, prompt: str, max_tokens: int) -> Observation:
        """POST /v1/completions, streamed, greedy; the reply, its usage and its time to first token."""
        self._spend()
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        try:
            with self.http.stream("POST", f"{self.base}/completions", json=body,
                                  headers={"Authorization": f"Bearer {key}"}) as r:
                if r.status_code != HTTPStatus.OK:
                    r.read()
                    return _error(r.status_code, r.content, time.perf_counter() - start)
                return _read_stream(r.iter_lines(), start)
        except httpx.HTTPError as e:
            raise CannotProbe(f"POST {self.base}/completions failed: {type(e).__name__}") from None


def _error(status: int, content: bytes, latency_s: float) -> Observation:
    try:
        err = json.loads(content)["error"]
        return Observation(status, latency_s=latency_s, error_code=err.get("code"), error_message=str(err.get("message"))[:300])
    except (ValueError, KeyError, TypeError, AttributeError):
        return Observation(status, latency_s=latency_s, error_message=content[:200].decode("utf-8", "replace"))


def _read_stream(lines, start: float) -> Observation:
    text, ttft, usage, error = [], None, {}, None
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if "error" in event:
            error = event["error"]
            break
        for choice in event.get("choices") or []:
            piece = choice.get("text") or ""
            if piece and ttft is None:
                ttft = time.perf_counter() - start
            text.append(piece)
        usage = event.get("usage") or usage
    latency = time.perf_counter() - start
    if error is not None:
        return Observation(HTTPStatus.INTERNAL_SERVER_ERROR, "".join(text), latency_s=latency,
                           error_code=error.get("code"), error_message=str(error.get("message"))[:300])
    details = usage.get("prompt_tokens_details") or {}
    return Observation(HTTPStatus.OK, "".join(text), usage.get("prompt_tokens"), usage.get("completion_tokens"),
                       details.get("cached_tokens"), ttft, latency)


def mask(key: str) -> str:
    """A key as the report shows it: enough to tell two apart, not enough to use."""
    return key[:3] + "..." + key[-2:] if len(key) > 8 else "***"
