"""The HTTP side of the engine core (core.py): `EngineLoop` sends it Submit and Cancel, and a reader thread
hands each handler's `Ticket` its streamed text (decoded here, off the core), then its `Response`, exactly
once. The core runs in a process of its own (`CoreProcess`) or on a thread (`CoreThread`, ServerThread);
if it dies or stops answering, every live and new request is answered 503 (docs/serve.md)."""

import asyncio
import itertools
import multiprocessing
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus

from transformers import PreTrainedTokenizerBase

from minikv.disagg.dist.child import STALL_S
from minikv.engine.front_door import FrontDoor
from minikv.engine.request import Request, Response, Sequence, error_response
from minikv.model.tokenizer import longest_token_chars
from minikv.serve.core import (SHUTTING_DOWN, Cancel, CoreFailed, CoreLoop, Drain, Ready, StepOutput, Stop,
                               Submit, core_main)

READ_WAIT_S = 0.1  # how long the reader waits for a StepOutput, and the watchdog between its looks
START_TIMEOUT_S = 180.0  # the core loads a model (the pair's workers theirs too): slow on a busy machine
STOP_TIMEOUT_S = 10.0
UNAVAILABLE = "service unavailable: the engine core is down"  # what clients are told
_keys = itertools.count(1)


@dataclass(eq=False)
class Ticket:
    """One HTTP request's place in the loop; its handler reads `updates`: text deltas if streamed, then the
    Response."""

    request: Request
    stream: bool
    aio_loop: asyncio.AbstractEventLoop
    prompt_ids: list[int] = field(default_factory=list)  # what check_at_door returned, on a worker thread
    updates: asyncio.Queue = field(default_factory=asyncio.Queue)
    key: int = field(default_factory=lambda: next(_keys))  # names it in the messages to and from the core
    # Written by the reader thread only:
    tokens_seen: int = 0  # tokens generated so far (what a gateway records if the client leaves)
    sent_chars: int = 0
    text: Sequence | None = None  # a stream's ids, decoded here as the engine decodes its answer


def post_all(items: list[tuple[Ticket, str | Response]]) -> None:
    """Hand every ticket its item, thread-safe, with one wake-up of each handler's event loop: one a step, not
    one a token per request. An item for a loop that has closed is dropped: nobody is waiting."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Ticket, str | Response]]] = {}
    for ticket, item in items:
        by_loop.setdefault(ticket.aio_loop, []).append((ticket, item))
    for aio_loop, batch in by_loop.items():
        try:
            aio_loop.call_soon_threadsafe(lambda batch=batch: [t.updates.put_nowait(i) for t, i in batch])
        except RuntimeError:  # that loop has closed
            pass


class CoreThread:
    """The core loop on a thread of this process, over a door already built (ServerThread: one model)."""

    where = "thread"

    def __init__(self, door: FrontDoor) -> None:
        self.door, self.pid = door, os.getpid()
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: queue.Queue = queue.Queue()
        loop = CoreLoop(door, self.outbox)
        self.worker = threading.Thread(target=loop.run, args=(self.inbox, lambda: True),
                                       name="minikv-engine-core", daemon=True)

    def start(self) -> None:
        self.worker.start()

    def end(self, timeout_s: float) -> None:
        if self.worker.is_alive():
            self.worker.join(timeout_s)


class CoreProcess:
    """The core loop in a process of its own (spawned), which loads the model as `minikv serve ARGS` asks."""

    where, door = "process", None

    def __init__(self, args) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        # not a daemon: a daemon may not start children, and the distributed pair's workers are the core's
        self.worker = ctx.Process(target=core_main, args=(args, self.inbox, self.outbox, os.getpid()),
                                  name="minikv-engine-core")
        self.worker.start()
        self.pid = self.worker.pid
        try:
            self.ready = self.wait_ready()
        except BaseException:  # it could not start, or Ctrl-C while it loads: no core is left behind
            self.end(1.0)
            raise

    def wait_ready(self) -> Ready:
        """The core's Ready, or ValueError (the core gone) with its one line of why."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                message = self.outbox.get(timeout=0.2)
            except queue.Empty:
                if not self.worker.is_alive():
                    break
                continue
            if isinstance(message, Ready):
                return message
            if isinstance(message, CoreFailed):
                raise ValueError(message.reason)
        if self.worker.exitcode is not None:
            raise ValueError(f"the engine core exited with code {self.worker.exitcode} while starting")
        raise ValueError(f"the engine core did not start within {START_TIMEOUT_S:.0f} s")

    def start(self) -> None:  # started at construction: the server prints its Ready lines before it listens
        pass

    def end(self, timeout_s: float) -> None:
        """Wait for the core to exit; kill it if it lingers."""
        self.worker.join(timeout_s)
        if self.worker.is_alive():
            self.worker.kill()
            self.worker.join()
        self.inbox.cancel_join_thread()  # a dead core never reads what is left: do not wait on it at exit


class EngineLoop:
    """The HTTP side's handle on the core: `submit` and `cancel` may be called from any thread."""

    def __init__(self, core: CoreThread | CoreProcess, tokenizer: PreTrainedTokenizerBase) -> None:
        self.core, self.tokenizer = core, tokenizer
        self.door = core.door  # the front door itself when the core is a thread of this process, else None
        self.chars_per_token = longest_token_chars(tokenizer)  # for the length check before tokenizing
        self._tickets: dict[int, Ticket] = {}  # key -> ticket, until its Response
        self._lock = threading.Lock()  # guards _tickets and _closed against the reader thread
        self._closed: str | None = None  # why new requests are refused (draining, stopping, the core down)
        self._stopping = False  # stop() was called: the core's end is a shutdown, not a failure
        self.failure: str | None = None
        self._stats: dict = {}
        self._stats_known = threading.Event()  # set by the core's first StepOutput
        self._last_heard = time.monotonic()
        self._reader = threading.Thread(target=self._read, name="minikv-core-reader", daemon=True)
        self._watchdog = threading.Thread(target=self._watch, name="minikv-core-watchdog", daemon=True)

    # -- any thread -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the core and the reader; return once the core's first StepOutput is in (/health shows its
        pools from the first call on), or after STALL_S if it never comes (the reader declares it down)."""
        self.core.start()
        self._last_heard = time.monotonic()
        self._reader.start()
        self._watchdog.start()
        self._stats_known.wait(STALL_S)

    def stop(self) -> None:
        """The core answers whatever is left 503 and exits; the reader hands those answers over, then ends."""
        with self._lock:
            if self._stopping:
                return
            self._closed, self._stopping = self._closed or SHUTTING_DOWN, True
        self.core.inbox.put(Stop())
        self.core.end(STOP_TIMEOUT_S)
        if self._reader.is_alive():
            self._reader.join(STOP_TIMEOUT_S)
        self._refuse_all(SHUTTING_DOWN)  # a core killed for lingering answered nobody

    def drain(self, grace_s: float) -> None:
        """Take no new request; let those in flight go on for `grace_s`, then end each with a 503."""
        with self._lock:
            if self._closed is None:
                self._closed = SHUTTING_DOWN
                self.core.inbox.put(Drain(grace_s))

    def submit(self, ticket: Ticket) -> None:
        if ticket.stream:
            ticket.text = Sequence.text_view(ticket.request, ticket.prompt_ids)
        with self._lock:
            refused = self._closed
            if refused is None:
                self._tickets[ticket.key] = ticket
                self.core.inbox.put(Submit(ticket.key, ticket.request, ticket.prompt_ids))
        if refused is not None:
            post_all([(ticket, unavailable(ticket, refused))])

    def cancel(self, ticket: Ticket) -> None:
        """The client went away: free the request's pages at the next step."""
        if ticket.key in self._tickets:
            self.core.inbox.put(Cancel(ticket.key))

    def stats(self) -> dict:
        """Pools and live requests as of the core's last step, where the core runs, and why it is down."""
        core = {"pid": self.core.pid, "runs_on": self.core.where, "alive": self.core.worker.is_alive()}
        return self._stats | {"core": core} | ({"failure": self.failure} if self.failure else {})

    # -- the reader and the watchdog threads ----------------------------------------------------------
    def _read(self) -> None:
        """Hand over each StepOutput until the core has ended and all it said is read, or it is down."""
        while self.failure is None:
            try:
                message = self.core.outbox.get(timeout=READ_WAIT_S)
            except queue.Empty:
                if not self.core.worker.is_alive():
                    return
                continue
            self._last_heard = time.monotonic()
            if isinstance(message, StepOutput):
                self._hand_over(message)

    def _watch(self) -> None:
        """If the core dies or goes silent, the server is down. Not the reader's job: a core stopped halfway
        through writing a message leaves the reader waiting, mid-read, for the rest."""
        while not self._stopping:
            if (problem := self._core_problem()) is not None:
                if not self._stopping:
                    self._fail(problem)
                return
            time.sleep(READ_WAIT_S)

    def _core_problem(self) -> str | None:
        """Why the core is down (it ended, or it has been silent for STALL_S), or None."""
        silent = time.monotonic() - self._last_heard
        core = f"the engine core ({self.core.where} {self.core.pid})"
        if not self.core.worker.is_alive():
            code = getattr(self.core.worker, "exitcode", None)  # a process's; a thread has none
            return f"{core} exited" + (f" with code {code}" if code else "")
        if silent > STALL_S:
            return f"{core} stopped answering: no message for {silent:.0f} s"
        return None

    def _hand_over(self, out: StepOutput) -> None:
        """New text to each stream (decoded from the step's ids), then each finished request's Response."""
        items: list[tuple[Ticket, str | Response]] = []
        for key, ids in out.tokens.items():
            if (ticket := self._tickets.get(key)) is not None:
                ticket.tokens_seen += len(ids)
                if ticket.text is not None:
                    ticket.text.output_ids += ids
                    self._send(items, ticket, ticket.text.visible_text(self.tokenizer))
        for key, response in out.finished:
            with self._lock:
                ticket = self._tickets.pop(key, None)
            if ticket is None:
                continue
            if ticket.stream and response.status == HTTPStatus.OK:
                self._send(items, ticket, response.text)
            ticket.tokens_seen = response.usage.completion_tokens or ticket.tokens_seen
            items.append((ticket, response))
        self._stats = out.stats
        self._stats_known.set()
        post_all(items)

    @staticmethod
    def _send(items: list, ticket: Ticket, text: str) -> None:
        if len(text) > ticket.sent_chars:
            items.append((ticket, text[ticket.sent_chars:]))
            ticket.sent_chars = len(text)

    def _fail(self, reason: str) -> None:
        """The core is down: say so on stderr, answer every live and new request 503, end a stalled core."""
        self.failure = reason
        print(f"minikv serve: {reason}; answering 503 from now on", file=sys.stderr, flush=True)
        with self._lock:
            self._closed = UNAVAILABLE
        self._refuse_all(UNAVAILABLE)
        self.core.end(0.0)

    def _refuse_all(self, reason: str) -> None:
        with self._lock:
            tickets, self._tickets = list(self._tickets.values()), {}
        post_all([(ticket, unavailable(ticket, reason)) for ticket in tickets])


def unavailable(ticket: Ticket, reason: str) -> Response:
    return error_response("-", ticket.request.tenant, HTTPStatus.SERVICE_UNAVAILABLE, reason)
