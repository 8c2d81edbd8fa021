"""What a connection may cost the server (docs/serve.md): on uvicorn's h11 protocol, a deadline for each
request's head (its body's is read_body's, in app.py), a cap on open connections, and one log line, not a
traceback per failed accept, at the descriptor limit."""

import asyncio
import resource
import sys
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 5.0  # from the connection (or the last reply) to a request's whole head
BODY_TIMEOUT_S = 10.0  # from a request's head to its whole body: a slow body gets a 408 (serve/app.py)
KEEP_ALIVE_S = 5  # uvicorn's own: an idle connection after a reply
MAX_CONNECTIONS = 4096  # at most; never more than half the descriptor limit
WARN_EVERY_S = 60.0  # a condition that persists is logged again this often, not once per connection


class Warner:
    """Writes a line to stderr at most once per WARN_EVERY_S for each kind of trouble."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def warn(self, kind: str, line: str) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, -WARN_EVERY_S) >= WARN_EVERY_S:
            self._last[kind] = now
            print(f"minikv serve: {line}", file=sys.stderr, flush=True)


def raise_descriptor_limit() -> None:
    """The soft limit on open files raised to the hard one, as vLLM does at start."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def connection_cap() -> int:
    """How many connections may be open at once: half the descriptor limit (the rest: model, pipes, logs)."""
    return max(1, min(MAX_CONNECTIONS, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2))


def guarded_protocol(cap: int, warner: Warner) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a head deadline and a connection cap (for `Config(http=...)`)."""

    class GuardedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > cap:
                warner.warn("cap", f"{cap} connections open (the cap): closing new ones until some end")
                transport.close()
                return
            self._arm_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_timer()  # the next request's head is due in time too, however slowly it arrives

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._head_overdue)

        def _head_overdue(self) -> None:
            """Close the connection if it has not sent a whole request head yet (h11: client IDLE)."""
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, warner: Warner) -> None:
    """At the descriptor limit asyncio reports every failed accept with a traceback (thousands a second):
    one line instead; every other error goes to the loop's default handler, as before."""

    def handle(loop_: asyncio.AbstractEventLoop, context: dict) -> None:
        error = context.get("exception")
        if isinstance(error, OSError) and context.get("message", "").startswith("socket.accept() out of"):
            warner.warn("accept", f"cannot accept connections: {error.strerror} (the descriptor limit); "
                        "refusing until connections end")
        else:
            loop_.default_exception_handler(context)

    loop.set_exception_handler(handle)
