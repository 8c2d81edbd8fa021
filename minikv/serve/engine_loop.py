"""The one thread that owns the front door: every HTTP connection's request is batched here.

HTTP handlers run on uvicorn's event loop; the engine runs here, on its own thread, so a long
prefill never stalls the event loop and requests from all clients share each step (continuous
batching across connections, as vLLM's engine core does). Handlers talk to the loop only
through a `Ticket`: the loop submits its request, relays a streamed request's text as the
sequence shows it (stop strings are the engine's business), and hands it its `Response` exactly
once. This is the only module of the server that touches the engine.

What the loop uses is the `FrontDoor` API, the same on `Engine`, `Cluster` and `DistCluster`
(`submit`, `cancel`, `step`, `has_work`, `seqs` for a live request's text, `health`, `close`).
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

from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.dist.cluster import DistCluster
from minikv.disagg.switches import SafetySwitches
from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.engine.front_door import FrontDoor
from minikv.engine.request import Request, Response, error_response
from minikv.model.llama import Llama

IDLE_WAIT_S = 0.05  # how long the idle loop waits for a request before looking again
TRANSPORTS = ("inprocess", "distributed")


def build_backend(model: Llama, tokenizer: PreTrainedTokenizerBase, switches: SafetySwitches, disagg: bool,
                  context_len: int | None, num_pages: int, transport: str = "inprocess",
                  model_dir: str | None = None, device: str | None = None, threads: int = 1, tenants: int = 1,
                  prefill_chunk: int | None = None) -> FrontDoor:
    """The Engine, or the Cluster with its switches (StartupRefused if startup_check says no).

    With `transport="distributed"` the cluster's nodes run in two worker processes (DistCluster),
    each loading the model from `model_dir` onto `device` (default: two GPUs if present, else CPU).
    The event log is off: a server runs for days, and the notebooks' step-by-step record would grow
    without end. The ownership audit stays on: /health reports the cross-tenant reads it saw. With
    `cache_partition` the prefix cache is cut for the server's `tenants` (one per key).
    """
    assert transport in TRANSPORTS, f"unknown transport {transport!r}"
    context = {"context_len": context_len} if context_len else {}
    context["cache_tenants"] = max(1, tenants)
    if disagg and transport == "distributed":
        return DistCluster(tokenizer, ClusterConfig(event_log=False, **context), switches, model_dir=model_dir,
                           devices=(device, device) if device else None, threads=threads)
    if disagg:
        return Cluster(model, tokenizer, ClusterConfig(event_log=False, **context), switches)
    chunks = {"chunked_prefill": True, "max_prefill_tokens": prefill_chunk} if prefill_chunk else {}
    return Engine(model, tokenizer, EngineConfig(num_pages=num_pages, event_log=False, cache_salt=switches.cache_salt,
                                                 cache_partition=switches.cache_partition, **context, **chunks))


@dataclass(eq=False)
class Ticket:
    """One HTTP request's place in the loop. The handler reads `updates`: text deltas (when it
    streams), then the Response."""

    request: Request
    stream: bool
    aio_loop: asyncio.AbstractEventLoop
    prompt_ids: list[int] | None = None  # what the door's checks returned, on the handler's thread
    updates: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived_s: float = field(default_factory=time.perf_counter)
    # Written by the loop thread only:
    engine_id: str | None = None
    tokens_seen: int = 0  # tokens generated so far (what a gateway records if the client leaves)
    sent_chars: int = 0
    done: bool = False

    def post(self, item: str | Response) -> None:
        """Hand `item` to the handler's event loop (thread-safe); dropped if that loop has closed."""
        post_all([(self, item)])


def post_all(items: list[tuple[Ticket, str | Response]]) -> None:
    """Hand every ticket its item with one wake-up of each handler's event loop (thread-safe): one a
    step, not one a token per request."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Ticket, str | Response]]] = {}
    for ticket, item in items:
        by_loop.setdefault(ticket.aio_loop, []).append((ticket, item))
    for aio_loop, batch in by_loop.items():
        try:
            aio_loop.call_soon_threadsafe(lambda batch=batch: [t.updates.put_nowait(i) for t, i in batch])
        except RuntimeError:  # that loop has closed: nobody is waiting
            pass


class EngineLoop:
    """Owns `door` on one thread; `submit` and `cancel` may be called from any thread."""

    def __init__(self, door: FrontDoor) -> None:
        self.door = door
        self._inbox: queue.SimpleQueue[tuple[str, Ticket]] = queue.SimpleQueue()
        self._live: dict[str, Ticket] = {}  # engine id -> ticket; the loop thread's alone
        self._stopping = threading.Event()
        self._drain_at: float | None = None  # once set (SIGTERM), no new request; at this time, 503 for the rest
        self._thread = threading.Thread(target=self._main, name="minikv-engine-loop", daemon=True)
        self._stats_lock = threading.Lock()
        self._stats: dict = {}
        self._outgoing: list[tuple[Ticket, str | Response]] = []  # this step's items, posted together
        self.steps = 0

    # -- any thread -------------------------------------------------------------------------------
    @property
    def context_len(self) -> int:
        """The advertised window: what /v1/models reports as max_model_len."""
        return self.door.config.context_len

    def start(self) -> None:
        self._refresh_stats()
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Finish the current step, answer whatever is left 503, and end the thread."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def drain(self, grace_s: float) -> None:
        """Take no new request; let those in flight go on for `grace_s`, then end each with a 503."""
        if self._drain_at is None:
            self._drain_at = time.monotonic() + grace_s

    def submit(self, ticket: Ticket) -> None:
        if self._stopping.is_set() or self._drain_at is not None:
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
                self._drain(block=not self.door.has_work())
                if self.door.has_work():
                    done = self.door.step()
                    self.steps += 1
                    self._relay()
                    for response in done:
                        self._deliver(response)
                if self._drain_at is not None and time.monotonic() >= self._drain_at:
                    self._refuse_live(HTTPStatus.SERVICE_UNAVAILABLE, "the server is shutting down")
                self._flush()
                self._refresh_stats()
            except Exception as e:  # a bug must end the requests it touched, never the server
                print(f"engine loop: step failed ({type(e).__name__}); answering live requests 500", file=sys.stderr)
                self._refuse_live(HTTPStatus.INTERNAL_SERVER_ERROR, f"engine error: {type(e).__name__}")
                self._flush()
        self._refuse_live(HTTPStatus.SERVICE_UNAVAILABLE, "the server is shutting down")
        self._flush()
        while not self._inbox.empty():
            kind, ticket = self._inbox.get_nowait()
            if kind == "submit":
                ticket.post(_refused(ticket, HTTPStatus.SERVICE_UNAVAILABLE, "the server is shutting down"))
        self.door.close()  # the distributed cluster's workers stop here; nothing else holds processes

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
                self.door.cancel(ticket.engine_id)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _submit(self, ticket: Ticket) -> None:
        try:
            ticket.engine_id = self.door.submit(ticket.request, ticket.prompt_ids)
        except Exception as e:  # the engine answers bad requests 400 itself; this is a bug, for this request only
            print(f"engine loop: submit failed ({type(e).__name__})", file=sys.stderr)
            self._finish(ticket, _refused(ticket, HTTPStatus.INTERNAL_SERVER_ERROR, f"engine error: {type(e).__name__}"))
            return
        self._live[ticket.engine_id] = ticket

    def _relay(self) -> None:
        """Each live request's progress; a streamed one's text as its sequence shows it (never a
        tail that could be the start of a stop string)."""
        for eid, ticket in self._live.items():
            seq = self.door.seqs.get(eid)
            if seq is None:
                continue
            ticket.tokens_seen = len(seq.output_ids)
            if ticket.stream and ticket.tokens_seen:
                seq.update_text(self.door.tokenizer)
                self._send(ticket, seq.visible_text())

    def _send(self, ticket: Ticket, text: str) -> None:
        if len(text) > ticket.sent_chars:
            self._outgoing.append((ticket, text[ticket.sent_chars:]))
            ticket.sent_chars = len(text)

    def _deliver(self, response: Response) -> None:
        ticket = self._live.pop(response.request_id, None)
        if ticket is None:
            return
        if ticket.stream and response.status == HTTPStatus.OK:
            self._send(ticket, response.text)
        ticket.tokens_seen = response.usage.completion_tokens or ticket.tokens_seen
        self._finish(ticket, response)

    def _refuse_live(self, status: HTTPStatus, reason: str) -> None:
        """End every live request with `status` (its engine request cancelled, so its pages come back)."""
        for eid, ticket in list(self._live.items()):
            try:
                self.door.cancel(eid)
            except Exception:  # noqa: BLE001 - a broken door still owes every client an answer
                pass
            self._finish(ticket, _refused(ticket, status, reason))
        self._live.clear()

    def _finish(self, ticket: Ticket, response: Response) -> None:
        ticket.done = True
        self._outgoing.append((ticket, response))

    def _flush(self) -> None:
        items, self._outgoing = self._outgoing, []
        post_all(items)

    def _refresh_stats(self) -> None:
        stats = self.door.health() | {"live_requests": len(self._live), "steps": self.steps}
        with self._stats_lock:
            self._stats = stats


def _refused(ticket: Ticket, status: HTTPStatus, reason: str) -> Response:
    return error_response(ticket.engine_id or "-", ticket.request.tenant, status, reason)
