"""The server's own gateway log: one JSON line per call, exactly the fields `scan-logs` reads (`FIELD_TYPES`).
`response_text` is the reply the client received; no prompt text is ever written, here or anywhere else."""

import json
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from minikv.logs.gateway_log import FIELD_TYPES


@dataclass
class Call:
    """One completion call as the gateway sees it, from its arrival."""

    request_id: str  # the `id` the client gets
    model: str
    arrived: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    arrived_s: float = field(default_factory=time.perf_counter)
    account: str = "-"  # until the key is known
    prompt_tokens: int = 0


class GatewayLog:
    """Appends one whole line per call to a JSON Lines file (or nowhere without a path), from any thread."""

    def __init__(self, path: str | Path | None) -> None:
        self._lock = threading.Lock()
        # every reply in clear text: a new log file is the owner's alone (0600)
        self._file: TextIO | None = None if not path else open(
            path, "a", encoding="utf-8", opener=lambda name, flags: os.open(name, flags, 0o600))

    def write(self, call: Call, status: int, completion_tokens: int = 0, ttft_s: float | None = None,
              text: str = "") -> None:
        """`ttft_s`: arrival to the first token; None for a refusal, timed to now."""
        if self._file is None:
            return
        ttft_ms = 1000 * (ttft_s if ttft_s is not None else time.perf_counter() - call.arrived_s)
        row = {"timestamp": call.arrived.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "request_id": call.request_id,
               "account": call.account, "model": call.model, "prompt_tokens": call.prompt_tokens,
               "completion_tokens": completion_tokens, "ttft_ms": round(ttft_ms, 3), "status": status,
               "response_text": text}
        assert list(row) == list(FIELD_TYPES), "the gateway log's schema changed: update scan-logs too"
        with self._lock:
            self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
