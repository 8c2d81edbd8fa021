"""The one thread that owns the front door (`Engine`, `Cluster` or `DistCluster`), as vLLM's engine core: every
connection's request shares each step, and a long prefill never stalls uvicorn's event loop. A handler talks to it
only through a `Ticket`: streamed text as the sequence shows it, then its `Response`, exactly once (docs/serve.md)."""

import asyncio
import queue
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from http import HTTPStatus

from transformers import PreTrainedTokenizerBase

from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.dist.cluster import DistCluster
from minikv.disagg.switches import SafetySwitches
from minikv.engine.config import EngineConfig, batch_for_pool
from minikv.engine.engine import Engine
from minikv.engine.front_door import FrontDoor, progress
from minikv.engine.partition import quota_pages
from minikv.engine.request import Request, Response, error_response
from minikv.model.llama import Llama

IDLE_WAIT_S = 0.05  # how long the idle loop waits for a request before looking again
TRANSPORTS = ("inprocess", "distributed")
SHUTTING_DOWN = "the server is shutting down"


def build_backend(model: Llama, tokenizer: PreTrainedTokenizerBase, switches: SafetySwitches, disagg: bool,
                  context_len: int | None, num_pages: int, transport: str = "inprocess",
                  model_dir: str | None = None, device: str | None = None, threads: int = 1, tenants: int = 1,
                  prefill_chunk: int | None = None, prefill_pages: int | None = None,
                  max_batch: int | None = None) -> FrontDoor:
    """The Engine, or the Cluster with its switches (in two worker processes with `transport="distributed"`; its
    prefill pool `prefill_pages`, by default ClusterConfig's). The event log is off (a server runs for days); the
    audit stays on. With `cache_partition` every pool is cut for `tenants` (one a key) and raised, if need be,
    until each tenant's quota holds one context window. The single engine runs `max_batch` requests at once, by
    default as many as its pool admits (batch_for_pool)."""
    assert transport in TRANSPORTS, f"unknown transport {transport!r}"
    context = {"context_len": context_len} if context_len else {}
    context["cache_tenants"] = max(1, tenants)
    if prefill_chunk:  # on the single engine, or on the pair's prefill node
        context |= {"chunked_prefill": True, "max_prefill_tokens": prefill_chunk}
    if disagg:
        pair = ClusterConfig(event_log=False, **context, **({"prefill_pages": prefill_pages} if prefill_pages else {}))
        if switches.cache_partition:
            pair = replace(pair, prefill_pages=quota_pages(pair.prefill_pages, pair.context_len, pair.page_size,
                                                           pair.cache_tenants),
                           decode_pages=quota_pages(pair.decode_pages, pair.context_len, pair.page_size,
                                                    pair.cache_tenants))
        if transport == "distributed":
            return DistCluster(tokenizer, pair, switches, model_dir=model_dir,
                               devices=(device, device) if device else None, threads=threads)
        return Cluster(model, tokenizer, pair, switches)
    config = EngineConfig(num_pages=num_pages, event_log=False, **context, cache_salt=switches.cache_salt,
                          cache_partition=switches.cache_partition, scrub_on_free=switches.scrub_on_free)
    if switches.cache_partition:
        config = replace(config, num_pages=quota_pages(num_pages, config.context_len, config.page_size,
                                                       config.cache_tenants))
    batch = max_batch or batch_for_pool(config.num_pages * config.page_size)
    return Engine(model, tokenizer, replace(config, max_batch_size=batch))


@dataclass(eq=False)
class Ticket:
    """One HTTP request's place in the loop; its handler reads `updates`: text deltas if streamed, then the Response."""

    request: Request
    stream: bool
    aio_loop: asyncio.AbstractEventLoop
    prompt_ids: list[int] | None = None  # what the door's checks returned, on the handler's thread
    updates: asyncio.Queue = field(default_factory=asyncio.Queue)
    # Written by the loop thread only:
    engine_id: str | None = None
    tokens_seen: int = 0  # tokens generated so far (what a gateway records if the client leaves)
    sent_chars: int = 0


def post_all(items: list[tuple[Ticket, str | Response]]) -> None:
    """Hand every ticket its item, thread-safe, with one wake-up of each handler's event loop: one a step, not one a
    token per request. An item for a loop that has closed is dropped: nobody is waiting."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Ticket, str | Response]]] = {}
    for ticket, item in items:
        by_loop.setdefault(ticket.aio_loop, []).append((ticket, item))
    for aio_loop, batch in by_loop.items():
        try:
            aio_loop.call_soon_threadsafe(lambda batch=batch: [t.updates.put_nowait(i) for t, i in batch])
        except RuntimeError:  # that loop has closed
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
        self._stats: dict = {}  # a fresh dict each step, swapped in whole: a reader never sees one half-made
        self._outgoing: list[tuple[Ticket, str | Response]] = []  # this step's items, posted together
        self.steps = 0

    # -- any thread -------------------------------------------------------------------------------
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
            post_all([(ticket, _refused(ticket, HTTPStatus.SERVICE_UNAVAILABLE, SHUTTING_DOWN))])
        else:
            self._inbox.put(("submit", ticket))

    def cancel(self, ticket: Ticket) -> None:
        """The client went away: free the request's pages at the next step."""
        self._inbox.put(("cancel", ticket))

    def stats(self) -> dict:
        """Pool occupancy and live requests, as of the last step."""
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
                    self._refuse_live(HTTPStatus.SERVICE_UNAVAILABLE, SHUTTING_DOWN)
                self._refresh_stats()
            except Exception as e:  # a bug must end the requests it touched, never the server
                print(f"engine loop: step failed ({type(e).__name__}); answering live requests 500", file=sys.stderr)
                self._refuse_live(HTTPStatus.INTERNAL_SERVER_ERROR, f"engine error: {type(e).__name__}")
            post_all(self._outgoing)
            self._outgoing.clear()
        self._refuse_live(HTTPStatus.SERVICE_UNAVAILABLE, SHUTTING_DOWN)
        while not self._inbox.empty():
            kind, ticket = self._inbox.get_nowait()
            if kind == "submit":
                self._outgoing.append((ticket, _refused(ticket, HTTPStatus.SERVICE_UNAVAILABLE, SHUTTING_DOWN)))
        post_all(self._outgoing)
        self.door.close()  # the distributed cluster's workers stop here; nothing else holds processes

    def _drain(self, block: bool) -> None:
        """Take every command waiting in the inbox (waiting a moment for the first when `block`)."""
        try:
            kind, ticket = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
            while True:
                if kind == "submit":
                    self._submit(ticket)
                elif self._live.get(ticket.engine_id) is ticket:  # a cancel of a request still live
                    self.door.cancel(ticket.engine_id)
                kind, ticket = self._inbox.get_nowait()
        except queue.Empty:
            return

    def _submit(self, ticket: Ticket) -> None:
        try:
            ticket.engine_id = self.door.submit(ticket.request, ticket.prompt_ids)
            self._live[ticket.engine_id] = ticket
        except Exception as e:  # the engine answers bad requests 400 itself; this is a bug, for this request only
            print(f"engine loop: submit failed ({type(e).__name__})", file=sys.stderr)
            reason = f"engine error: {type(e).__name__}"
            self._outgoing.append((ticket, _refused(ticket, HTTPStatus.INTERNAL_SERVER_ERROR, reason)))

    def _relay(self) -> None:
        """Each live request's progress; a streamed one's visible text (never a tail that could start a stop string)."""
        for eid, ticket in self._live.items():
            if (now := progress(self.door, eid, decode=ticket.stream)) is not None:
                ticket.tokens_seen, text = now
                self._send(ticket, text)

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
        self._outgoing.append((ticket, response))

    def _refuse_live(self, status: HTTPStatus, reason: str) -> None:
        """End every live request with `status` (its engine request cancelled, so its pages come back)."""
        for eid, ticket in self._live.items():
            try:
                self.door.cancel(eid)
            except Exception:  # noqa: BLE001 - a broken door still owes every client an answer
                pass
            self._outgoing.append((ticket, _refused(ticket, status, reason)))
        self._live.clear()

    def _refresh_stats(self) -> None:
        self._stats = self.door.health() | {"live_requests": len(self._live), "steps": self.steps}


def _refused(ticket: Ticket, status: HTTPStatus, reason: str) -> Response:
    return error_response(ticket.engine_id or "-", ticket.request.tenant, status, reason)
