"""The server's own gateway log: one JSON line per call, in the schema `scan-logs` reads.

The fields are exactly `minikv.logs.gateway_log.FIELD_TYPES`, in that order, so
`python -m minikv scan-logs LOG` runs on what this server wrote. `response_text` is the
reply the client received (the schema asks for it: it is what a reviewer reads); no prompt
text is ever written, here or anywhere else the server logs.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from minikv.logs.gateway_log import FIELD_TYPES


@dataclass(frozen=True)
class CallRecord:
    """What the gateway saw of one call."""

    arrived: datetime  # UTC
    request_id: str
    account: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float  # arrival -> first token sent; arrival -> the error for a refusal
    status: int
    response_text: str

    def to_json(self) -> dict:
        row = {
            "timestamp": self.arrived.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "request_id": self.request_id,
            "account": self.account,
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_ms": round(self.ttft_ms, 3),
            "status": self.status,
            "response_text": self.response_text,
        }
        assert list(row) == list(FIELD_TYPES), "the gateway log's schema changed: update scan-logs too"
        return row


class GatewayLog:
    """Appends records to a JSON Lines file, one whole line at a time, from any thread."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._file: TextIO | None = open(self.path, "a", encoding="utf-8") if self.path else None

    def write(self, record: CallRecord) -> None:
        if self._file is None:
            return
        line = json.dumps(record.to_json(), ensure_ascii=False) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
