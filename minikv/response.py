"""What a client gets back: shaped like an HTTP API's reply, because the status code can lie.

The incident's lesson is that a 200 with a fluent answer can still be wrong, so a response
carries everything a monitor could look at: status, text, token usage, time to first token,
per-token times and the error message.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from http import HTTPStatus

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that went away; http.HTTPStatus has none


@dataclass
class Usage:
    """Token counts as the API reports them (prompt_tokens is what the client *sent*)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache, not prefill


@dataclass
class Response:
    """One request's answer."""

    request_id: str
    tenant: str
    status: int  # 200 served, 400 refused (the error says why), 499 cancelled, 500 failed while served
    text: str = ""
    usage: Usage = field(default_factory=Usage)
    ttft_s: float | None = None  # seconds from arrival to the first generated token
    token_times_s: list[float] = field(default_factory=list)  # arrival -> each token
    error: str | None = None
    finish_reason: str | None = None  # "stop" (end of text), "length" (max tokens), "abort"
    client_request_id: str | None = None  # the client's own id, echoed back; never used to route

    def __post_init__(self) -> None:
        self.status = int(self.status)  # an HTTPStatus prints as its name in lists; keep the plain number

    def to_json(self) -> dict:
        """The public contract: status, text, usage, ttft_s, error."""
        return {
            "status": self.status,
            "text": self.text,
            "usage": asdict(self.usage),
            "ttft_s": self.ttft_s,
            "error": self.error,
        }


def bad_request(request_id: str, tenant: str, reason: str, prompt_tokens: int = 0,
                client_request_id: str | None = None) -> Response:
    """HTTP 400 with the reason; nothing was generated."""
    return Response(request_id, tenant, HTTPStatus.BAD_REQUEST, usage=Usage(prompt_tokens, 0), error=reason,
                    finish_reason="abort", client_request_id=client_request_id)
