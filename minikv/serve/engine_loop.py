"""The one thread that owns the engine: every HTTP connection's request is batched here.

HTTP handlers run on uvicorn's event loop; the engine runs here, on its own thread, so a long
prefill never stalls the event loop and requests from all clients share each step (continuous
batching across connections, as vLLM's engine core does). Handlers talk to the loop only
through a `Ticket`: the loop submits it, streams its text back as tokens appear, and hands it
its `Outcome` exactly once. This is the only module of the server that touches the engine.

What the loop reads of the engine is its front door, the same on `Engine`, `Cluster` and
`DistCluster` (`submit`, `cancel`, `step`, `has_work`, `output_ids` to stream tokens before a
request completes, `health` for /health, and `close` when the loop ends).
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus

from transformers import PreTrainedTokenizerBase

from minikv.config import EngineConfig
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.dist_cluster import DistCluster
from minikv.disagg.switches import SafetySwitches
from minikv.engine import Engine
from minikv.model import Llama
from minikv.request import Request
from minikv.response import Response
from minikv.tokenizer import decode

Backend = Engine | Cluster | DistCluster
IDLE_WAIT_S = 0.05  # how long the idle loop waits for a request before looking again
TRANSPORTS = ("inprocess", "distributed")


def build_backend(model: Llama, tokenizer: PreTrainedTokenizerBase, switches: SafetySwitches, disagg: bool,
                  context_len: int | None, num_pages: int, transport: str = "inprocess",
                  model_dir: str | None = None, device: str | None = None, threads: int = 1) -> Backend:
    """The Engine, or the Cluster with its switches (StartupRefused if startup_check says no).

    With `transport="distributed"` the cluster's nodes run in two worker processes (DistCluster),
    each loading the model from `model_dir` onto `device` (default: two GPUs if present, else CPU).
    The event log is off: a server runs for days, and the notebooks' step-by-step record would grow
    without end. The ownership audit stays on: /health reports the cross-tenant reads it saw.
    """
    assert transport in TRANSPORTS, f"unknown transport {transport!r}"
    context = {"context_len": context_len} if context_len else {}
    if disagg and transport == "distributed":
        return DistCluster(tokenizer, ClusterConfig(event_log=False, **context), switches, model_dir=model_dir,
                           devices=(device, device) if device else None, threads=threads)
    if disagg:
        return Cluster(model, tokenizer, ClusterConfig(event_log=False, **context), switches)
    return Engine(model, tokenizer, EngineConfig(num_pages=num_pages, event_log=False, cache_salt=switches.cache_salt,
                                                 **context))


@dataclass(frozen=True)
class Outcome:
    """How a request ended, as the client will be told."""

    status: int
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    error: str | None
    ttft_s: float | None  # arrival -> the loop saw the first token; None when none came


@dataclass(eq=False)
class Ticket:
    """One HTTP request's place in the loop. The handler reads `updates`: str deltas, then an Outcome."""

    request: Request
    stops: list[str]
    aio_loop: asyncio.AbstractEventLoop
    updates: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived_s: float = field(default_factory=time.perf_counter)
    # Written by the loop thread only:
    engine_id: str | None = None
    tokens_seen: int = 0
    sent_chars: int = 0
    first_token_s: float | None = None
    stopped_text: str | None = None  # set when a stop string ended it; the engine is then cancelled
    done: bool = False

    def post(self, item: str | Outcome) -> None:
        """Hand `item` to the handler's event loop (thread-safe); dropped if that loop has closed."""
        try:
            self.aio_loop.call_soon_threadsafe(self.updates.put_nowait, item)
        except RuntimeError:
            pass


class EngineLoop:
    """Owns `backend` on one thread; `submit` and `cancel` may be called from any thread."""

    def __init__(self, backend: Backend, tokenizer: PreTrainedTokenizerBase) -> None:
        self.backend, self.tokenizer = backend, tokenizer
        self._inbox: queue.SimpleQueue[tuple[str, Ticket]] = queue.SimpleQueue()
        self._live: dict[str, Ticket] = {}  # engine id -> ticket; the loop thread's alone
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._main, name="minikv-engine-loop", daemon=True)
        self._stats_lock = threading.Lock()
        self._stats: dict = {}
        self.steps = 0

    # -- any thread -------------------------------------------------------------------------------
    @property
    def context_len(self) -> int:
        """The advertised window: what /v1/models reports as max_model_len."""
        return self.backend.config.context_len

    def startup_log(self) -> list[str]:
        """Each pool next to the context window, one line per node."""
        log = self.backend.startup_log()
        return [log] if isinstance(log, str) else list(log)

    def start(self) -> None:
        self._refresh_stats()
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Finish the current step, answer whatever is left 503, and end the thread."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def submit(self, ticket: Ticket) -> None:
        if self._stopping.is_set():
            ticket.post(_refused(ticket, HTTPStatus.SERVICE_UNAVAILABLE, "the server is shutting down"))
            return
        self._inbox.put(("submit", ticket))

    def cancel(self, ticket: Ticket) -> None:
        """The client went away: free the request's pages at the next step."""
        self._inbox.put(("cancel", ticket))

    def stats(self) -> dict:
        """Pool occupancy and live requests, as of the last step."""
        with self._stats_lock:
            return dict(self._stats)

    # -- the loop thread --------------------------------------------------------------------------
    def _main(self) -> None:
        while not self._stopping.is_set():
            try:
                self._drain(block=not self.backend.has_work())
                if self.backend.has_work():
                    done = self.backend.step()
                    self.steps += 1
                    for response in done:
                        self._finish(response)
                    self._stream()
                self._refresh_stats()
            except Exception as e:  # a bug must end the requests it touched, never the server
                print(f"engine loop: step failed ({type(e).__name__}); answering live requests 500", file=sys.stderr)
                for ticket in list(self._live.values()):
                    self._deliver(ticket, _refused(ticket, HTTPStatus.INTERNAL_SERVER_ERROR, f"engine error: {type(e).__name__}"))
                self._live.clear()
        for ticket in list(self._live.values()):
            self._deliver(ticket, _refused(ticket, HTTPStatus.SERVICE_UNAVAILABLE, "the server is shutting down"))
        while not self._inbox.empty():
            kind, ticket = self._inbox.get_nowait()
            if kind == "submit":
                ticket.post(_refused(ticket, HTTPStatus.SERVICE_UNAVAILABLE, "the server is shutting down"))
        self.backend.close()  # the distributed cluster's workers stop here; nothing else holds processes

    def _drain(self, block: bool) -> None:
        try:
            command = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, ticket = command
            if kind == "submit":
                self._submit(ticket)
            elif ticket.engine_id in self._live and not ticket.done:
                self.backend.cancel(ticket.engine_id)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _submit(self, ticket: Ticket) -> None:
        try:
            ticket.engine_id = self.backend.submit(ticket.request)
        except Exception as e:  # the engine answers bad requests 400 itself; this is a bug, for this request only
            print(f"engine loop: submit failed ({type(e).__name__})", file=sys.stderr)
            self._deliver(ticket, _refused(ticket, HTTPStatus.INTERNAL_SERVER_ERROR, f"engine error: {type(e).__name__}"))
            return
        self._live[ticket.engine_id] = ticket

    def _progress(self) -> dict[str, list[int]]:
        """Generated ids so far of each live request that has any (the front door's `output_ids`)."""
        progress = {eid: self.backend.output_ids(eid) for eid in self._live}
        return {eid: ids for eid, ids in progress.items() if ids}

    def _stream(self) -> None:
        """Send each live request the text generated since the last step, and apply stop strings."""
        now = time.perf_counter()
        for eid, ids in self._progress().items():
            ticket = self._live[eid]
            if ticket.stopped_text is not None or len(ids) == ticket.tokens_seen:
                continue
            ticket.tokens_seen = len(ids)
            if ticket.first_token_s is None:
                ticket.first_token_s = now - ticket.arrived_s
            text, stop_at = _apply_stops(decode(self.tokenizer, ids), ticket.stops)
            if stop_at is not None:
                ticket.stopped_text = text
                self.backend.cancel(eid)  # its pages go back now; its 499 is turned into a 200 below
            self._send(ticket, text if stop_at is not None else text[: _safe_length(text, ticket.stops)])

    def _send(self, ticket: Ticket, text: str) -> None:
        if len(text) > ticket.sent_chars:
            ticket.post(text[ticket.sent_chars:])
            ticket.sent_chars = len(text)

    def _finish(self, response: Response) -> None:
        ticket = self._live.pop(response.request_id, None)
        if ticket is None:
            return
        usage = response.usage
        if ticket.stopped_text is not None:  # ended by a stop string: a normal 200 for the client
            text, status, reason, error = ticket.stopped_text, HTTPStatus.OK, "stop", None
            completion_tokens = ticket.tokens_seen
        else:
            text, stop_at = _apply_stops(response.text, ticket.stops)
            status, error, completion_tokens = response.status, response.error, usage.completion_tokens
            reason = "stop" if stop_at is not None else response.finish_reason
        if status == HTTPStatus.OK and ticket.first_token_s is None and completion_tokens:
            ticket.first_token_s = time.perf_counter() - ticket.arrived_s
        self._send(ticket, text if status == HTTPStatus.OK else "")
        self._deliver(ticket, Outcome(int(status), text, reason, usage.prompt_tokens, completion_tokens,
                                      usage.cached_tokens, error, ticket.first_token_s if status == HTTPStatus.OK else None))

    def _deliver(self, ticket: Ticket, outcome: Outcome) -> None:
        ticket.done = True
        ticket.post(outcome)

    def _refresh_stats(self) -> None:
        stats = self.backend.health() | {"live_requests": len(self._live), "steps": self.steps}
        with self._stats_lock:
            self._stats = stats


def _apply_stops(text: str, stops: list[str]) -> tuple[str, int | None]:
    """`text` cut before the earliest stop string, and where; (text, None) when none occurs."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if not hits:
        return text, None
    return text[: min(hits)], min(hits)


def _safe_length(text: str, stops: list[str]) -> int:
    """How much of `text` may be streamed: hold back a tail that could be the start of a stop string."""
    if not stops:
        return len(text)
    return max(0, len(text) - (max(len(s) for s in stops) - 1))


def _refused(ticket: Ticket, status: HTTPStatus, reason: str) -> Outcome:
    return Outcome(int(status), "", "abort", 0, 0, 0, reason, None)
