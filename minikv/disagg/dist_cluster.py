"""The front door across processes: `Cluster`'s client API, with the nodes in two worker processes.

`DistCluster` lives in the server's process. It does what `Cluster`'s front door does (engine
ids, the request checks, the advertised window, one room and one audit uid per request) and
hands each checked request to two worker processes (dist_worker.py, spawned with
torch.multiprocessing): the prefill worker and the decode worker, each with its own model copy,
pool, device, audit and `DistKVManager`. The control plane is two multiprocessing queues per
direction (requests and cancels in; tokens, outcomes and pool reports out); the KV moves on
torch.distributed, between the workers, never through the front door.

A worker can die (killed, out of memory, a bug). The front door looks at both workers' exit
codes on every step and submit; once one is gone the pair is down: every live request is answered
503, every new one too, the surviving worker is stopped, and `health()` says which worker died
and how. `close()` stops both workers (the server calls it on shutdown); a worker whose parent
has gone exits on its own.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import queue
import sys
import time
from http import HTTPStatus

import torch
from transformers import PreTrainedTokenizerBase

from minikv.admission import check_at_door
from minikv.disagg.cluster import ClusterConfig, StartupRefused, decode_response, startup_problem
from minikv.disagg.dist_pair import DECODE_RANK, PREFILL_RANK, free_port
from minikv.disagg.dist_worker import SeqSpec, WorkerSpec, worker_main
from minikv.disagg.switches import SafetySwitches
from minikv.front_door import FrontDoor
from minikv.prefix_cache import request_page_keys
from minikv.request import Request
from minikv.response import Response, Usage

NAMES = {PREFILL_RANK: "prefill", DECODE_RANK: "decode"}
STEP_WAIT_S = 0.01  # how long one step waits for news from the workers
START_TIMEOUT_S = 180.0  # both workers load a model: slow on a busy machine
STOP_TIMEOUT_S = 5.0


class WorkerStartError(RuntimeError):
    """A worker failed to start (or the pair did not meet) within the start timeout."""


def default_devices() -> tuple[str, str]:
    """Two GPUs: prefill on the first, decode on the second; otherwise both workers on the CPU."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        return "cuda:0", "cuda:1"
    return "cpu", "cpu"


class DistCluster(FrontDoor):
    """A disaggregated pair in two worker processes behind one front door (the client API of Cluster)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: ClusterConfig = ClusterConfig(),
                 switches: SafetySwitches = SafetySwitches(), model_dir: str | None = None,
                 devices: tuple[str, str] | None = None, transfer_timeout_s: float | None = 30.0,
                 link_s_per_page: float = 0.0, threads: int = 1) -> None:
        if switches.startup_check and (problem := startup_problem(config)):
            raise StartupRefused(problem)
        super().__init__()
        self.config, self.switches, self.tokenizer = config, switches, tokenizer
        self.failure: str | None = None  # why the pair is down; None while both workers live
        self.reports: dict[int, dict] = {PREFILL_RANK: {}, DECODE_RANK: {}}  # each worker's latest report
        self._live: dict[str, SeqSpec] = {}  # engine id -> the request both workers hold, until answered
        self._progress: dict[str, list[int]] = {}  # engine id -> tokens the decode worker has generated
        self._in_flight: set[str] = set()  # engine ids whose KV the prefill worker has posted
        self._rooms = itertools.count(1)
        ctx = multiprocessing.get_context("spawn")
        self._news = ctx.Queue()
        self._commands = {rank: ctx.Queue() for rank in NAMES}
        spec = WorkerSpec(free_port(), model_dir, devices or default_devices(), config, switches,
                          transfer_timeout_s, link_s_per_page, threads)
        self.workers = {rank: ctx.Process(target=worker_main, args=(rank, spec, self._commands[rank], self._news, os.getpid()),
                                          name=f"minikv-{name}-worker", daemon=True) for rank, name in NAMES.items()}
        for process in self.workers.values():
            process.start()
        self._startup = self._wait_ready()

    def _wait_ready(self) -> list[str]:
        """Both workers' startup lines, or WorkerStartError (both stopped) naming what went wrong."""
        lines: dict[int, str] = {}
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(lines) < len(NAMES):
            dead = self._dead_worker()  # read before the queue: what a dead worker said is in it by now
            try:
                message = self._news.get(timeout=0.1)
            except queue.Empty:
                message = None
            problem = None
            if message is not None and message[0] == "ready":
                lines[message[1]] = message[2]
            elif message is not None and message[0] == "error":
                problem = f"the {NAMES[message[1]]} worker failed to start: {message[2].splitlines()[0]}"
            elif message is not None:
                self._handle(message)
            elif dead or time.monotonic() > deadline:
                problem = dead or "the workers did not start in time"
            if problem:
                self.close()
                raise WorkerStartError(problem)
        return [lines[rank] for rank in NAMES]

    def startup_log(self) -> list[str]:
        """Each worker's startup line: its pool next to the context window, its pid and device."""
        return list(self._startup)

    # -- requests in ---------------------------------------------------------------------------
    def check(self, request: Request) -> list[int]:
        """The front door's checks, the same as the in-process cluster's."""
        return check_at_door(request, self.tokenizer, self.config.context_len)

    def submit(self, request: Request) -> str:
        """Check the request at the door and hand it to both workers; 400 or 503 at once if it cannot go."""
        request_id, tenant, name, ids = self._intake(request, self.check)
        if ids is None:
            return request_id
        self._watch_workers()
        if self.failure:
            self._answer(self._unavailable(request_id, tenant, name))
            return request_id
        room = next(self._rooms)
        keys = []
        if self.config.prefix_caching:
            keys = request_page_keys(ids, self.config.page_size, tenant, request.cache_salt, self.switches.cache_salt)
        spec = SeqSpec(request_id, tenant, list(ids), request.max_tokens, request.sampling, time.perf_counter(), room, name, keys)
        self._live[request_id] = spec
        for commands in self._commands.values():
            commands.put(("admit", spec))
        return request_id

    def cancel(self, request_id: str) -> bool:
        """The client went away: both workers retire the request at their next gate."""
        if request_id not in self._live:
            return False
        for commands in self._commands.values():
            commands.put(("cancel", request_id))
        return True

    def output_ids(self, request_id: str) -> list[int]:
        """Tokens the decode worker has generated so far for a live request; [] otherwise."""
        return list(self._progress.get(request_id, []))

    def kv_in_flight(self, request_id: str) -> bool:
        """Whether the prefill worker has posted this request's KV and it has not been answered yet."""
        return request_id in self._in_flight

    def _log_refusal(self, request_id: str, tenant: str, reason: str) -> None:
        pass  # the event log is off in the worker pair, and the front door keeps none

    # -- the clock -----------------------------------------------------------------------------
    def _busy(self) -> bool:
        return bool(self._live)

    def _advance(self) -> None:
        """Check both workers live, then take their news (waiting up to STEP_WAIT_S for the first)."""
        self._watch_workers()
        self._take_news(STEP_WAIT_S)

    def _take_news(self, wait_s: float) -> None:
        """Handle every message the workers have sent; wait up to `wait_s` for the first."""
        try:
            message = self._news.get(timeout=wait_s) if wait_s > 0 else self._news.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(message)
            try:
                message = self._news.get_nowait()
            except queue.Empty:
                return

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "outcome":
            seq, status, error = message[1:]
            if self._live.pop(seq.request_id, None) is not None:
                self._progress.pop(seq.request_id, None)
                self._in_flight.discard(seq.request_id)
                self._answer(decode_response(self.tokenizer, seq, status, error))
        elif kind == "tokens" and message[1] in self._live:
            self._progress.setdefault(message[1], []).extend(message[2])
        elif kind == "in_flight" and message[1] in self._live:
            self._in_flight.add(message[1])
        elif kind == "report":
            self.reports[message[1]] = message[2]
        elif kind == "error":
            self._fail(f"the {NAMES[message[1]]} worker failed: {message[2].splitlines()[0]}")

    # -- failure -------------------------------------------------------------------------------
    def _dead_worker(self) -> str | None:
        for rank, process in self.workers.items():
            if not process.is_alive():
                return f"the {NAMES[rank]} worker (pid {process.pid}) exited with code {process.exitcode}"
        return None

    def _watch_workers(self) -> None:
        if self.failure is None and (problem := self._dead_worker()):
            self._fail(problem)

    def _fail(self, reason: str) -> None:
        """The pair is down: answer every live request 503 and stop the surviving worker."""
        if self.failure is not None:
            return
        self.failure = reason
        print(f"distributed cluster: {reason}; the pair is down, answering 503", file=sys.stderr, flush=True)
        for request_id, spec in list(self._live.items()):
            self._answer(self._unavailable(request_id, spec.tenant, spec.client_request_id))
        self._live.clear()
        self._progress.clear()
        self._in_flight.clear()
        self._stop_workers()

    def _unavailable(self, request_id: str, tenant: str, name: str | None) -> Response:
        return Response(request_id, tenant, HTTPStatus.SERVICE_UNAVAILABLE, usage=Usage(),
                        error=f"service unavailable: {self.failure}", finish_reason="abort", client_request_id=name)

    # -- what the server reports -----------------------------------------------------------------
    def health(self) -> dict:
        """Pools and audit as the workers last reported them, and whether each worker lives.

        It takes the news first: a worker reports its pages freed after the last answer, when the
        server, idle, no longer steps.
        """
        self._watch_workers()
        self._take_news(0.0)
        pools = {NAMES[r]: {"free_pages": rep.get("free_pages", 0), "total_pages": rep.get("total_pages", 0)}
                 for r, rep in self.reports.items()}
        workers = {NAMES[r]: {"pid": p.pid, "alive": p.is_alive(), "exitcode": p.exitcode} for r, p in self.workers.items()}
        return {"pools": pools, "cross_tenant_reads": self.cross_tenant_reads, "workers": workers, "failure": self.failure}

    @property
    def cross_tenant_reads(self) -> int:
        return sum(rep.get("cross_tenant_reads", 0) for rep in self.reports.values())

    def leaked_pages(self) -> int:
        """Pages held in either worker's pool, as last reported (zero once idle)."""
        return sum(rep.get("pages_held", 0) for rep in self.reports.values())

    # -- shutdown ------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop both workers: ask, wait, then kill what is left. Safe to call twice.

        A pair that was shut down on purpose is not a failure: nothing is reported as a dead worker.
        """
        if self.failure is None:
            self.failure = "the server is shutting down"
        self._stop_workers()

    def _stop_workers(self) -> None:
        """Ask each live worker to stop, keep reading its news (a worker exits only once its queue is
        flushed) until both are gone, kill one that outstays STOP_TIMEOUT_S."""
        for rank, process in self.workers.items():
            if process.is_alive():
                self._commands[rank].put(("stop",))
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(p.is_alive() for p in self.workers.values()) and time.monotonic() < deadline:
            try:
                self._news.get(timeout=0.05)  # dropped: nobody is waiting for it any more
            except queue.Empty:
                pass
        for process in self.workers.values():
            if process.is_alive():
                process.kill()
            process.join(STOP_TIMEOUT_S)
        for commands in self._commands.values():
            commands.cancel_join_thread()  # a dead worker never reads what is left: do not wait on it at exit
