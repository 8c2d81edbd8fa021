"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, with a real status.

Every refusal the server makes goes through `APIError`, so a client library sees the same
shape it sees from OpenAI, vLLM or SGLang, and can read `code` instead of parsing prose.
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi.responses import JSONResponse

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
        first_word = reason.split(" ", 1)[0]
        return APIError(HTTPStatus.BAD_REQUEST, reason, "invalid_value", first_word if first_word in REQUEST_FIELDS else None)
    if status == 499:
        return APIError(HTTPStatus.BAD_REQUEST, reason, "cancelled")
    if status == HTTPStatus.SERVICE_UNAVAILABLE:  # a worker of the distributed pair is down, or shutdown
        return APIError(HTTPStatus.SERVICE_UNAVAILABLE, reason, "unavailable")
    return APIError(HTTPStatus.INTERNAL_SERVER_ERROR, reason or "the engine failed this request", "engine_error")
