"""What a client gets back: shaped like an HTTP API's reply, because the status code can lie.

The incident's lesson is that a 200 with a fluent answer can still be wrong, so a response
carries everything a monitor could look at: status, text, token usage, time to first token,
per-token times and the error message.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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
    status: int  # 200 served, 400 refused (the error says why), 500 engine fault
    text: str = ""
    usage: Usage = field(default_factory=Usage)
    ttft_s: float | None = None  # seconds from arrival to the first generated token
    token_times_s: list[float] = field(default_factory=list)  # arrival -> each token
    error: str | None = None
    finish_reason: str | None = None  # "stop" (end of text), "length" (max tokens), "abort"

    def to_json(self) -> dict:
        """The public contract: status, text, usage, ttft_s, error."""
        return {
            "status": self.status,
            "text": self.text,
            "usage": asdict(self.usage),
            "ttft_s": self.ttft_s,
            "error": self.error,
        }


def bad_request(request_id: str, tenant: str, reason: str, prompt_tokens: int = 0) -> Response:
    """HTTP 400 with the reason; nothing was generated."""
    return Response(request_id, tenant, 400, usage=Usage(prompt_tokens, 0), error=reason, finish_reason="abort")
