"""The front door across processes: the pair's nodes in two worker processes (worker.py), fed typed
messages; the KV moves between the workers, never through here. A worker that dies or stops
answering takes the pair down: every live and new request is answered 503 (docs/disagg.md).
"""

import multiprocessing
import multiprocessing.connection
import os
import queue
import socket
import sys
import threading
import time
from http import HTTPStatus

from transformers import PreTrainedTokenizerBase

from minikv.disagg.cluster import ROLES, ClusterConfig, PairDoor, pair_devices
from minikv.disagg.dist.child import STALL_S
from minikv.disagg.dist.messages import Admit, Cancel, News, Ready, Stop, WorkerFailed
from minikv.disagg.dist.worker import WorkerSpec, worker_main
from minikv.disagg.switches import SafetySwitches
from minikv.engine.events import EventLog
from minikv.engine.request import Finished, Request, Sequence

STEP_WAIT_S = 0.01  # how long one step waits for news from the workers
START_TIMEOUT_S = 180.0  # both workers load a model: slow on a busy machine
STOP_TIMEOUT_S = 5.0
UNAVAILABLE = "service unavailable: a worker of the prefill/decode pair is down"  # what clients are told


class WorkerStartError(RuntimeError):
    """A worker failed to start (or the pair did not meet) within the start timeout."""


def free_port() -> int:
    """A TCP port on loopback that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DistCluster(PairDoor):
    """A disaggregated pair in two worker processes behind one front door (the client API of Cluster)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: ClusterConfig = ClusterConfig(),
                 switches: SafetySwitches = SafetySwitches.preset("safe"), model_dir: str | None = None,
                 devices: tuple[str, str] | None = None, link_s_per_page: float = 0.0,
                 threads: int = 1) -> None:
        super().__init__(tokenizer, config, switches, EventLog(enabled=False))  # the workers keep none
        self.failure: str | None = None  # why the pair is down (for the operator); None while both live
        self.last_heard: dict[int, float] = {}  # when each worker last sent a message
        self.stopping = False  # close() was called: a shutdown, not a failure
        self.reports: dict[int, dict] = {rank: {} for rank in range(len(ROLES))}  # each worker's latest
        self._ended: list[Finished] = []
        self._stopper: threading.Thread | None = None  # stops the pair's workers after a failure
        ctx = multiprocessing.get_context("spawn")
        self._news: queue.Queue = queue.Queue()  # both workers' messages, in the order they arrived here
        self._commands = {rank: ctx.Queue() for rank in self.reports}
        outboxes = {rank: ctx.Queue() for rank in self.reports}  # one each: see relay()
        spec = WorkerSpec(free_port(), model_dir, devices or pair_devices("cpu"), config, switches,
                          link_s_per_page, threads)
        self.workers = {rank: ctx.Process(target=worker_main, name=f"minikv-{role}-worker", daemon=True,
                                          args=(rank, spec, self._commands[rank], outboxes[rank],
                                                os.getpid()))
                        for rank, role in enumerate(ROLES)}
        self._relays = {rank: threading.Thread(target=relay, args=(outboxes[rank], self._news, process),
                                               name=f"minikv-{ROLES[rank]}-news", daemon=True)
                        for rank, process in self.workers.items()}
        for rank, process in self.workers.items():
            process.start()
            self._relays[rank].start()
        self._startup: dict[int, str] = {}  # rank -> its startup line
        self._wait_ready()
        self.last_heard = {rank: time.monotonic() for rank in self.workers}  # both just said they are ready

    def _wait_ready(self) -> None:
        """Until both workers are Ready; else WorkerStartError (both stopped) naming what went wrong."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(self._startup) < len(ROLES):
            dead = self._dead_worker()  # read before the queue: what a dead worker said is in it by now
            try:
                message = self._news.get(timeout=0.1)
            except queue.Empty:
                message = None
            if isinstance(message, WorkerFailed):
                dead = f"the {ROLES[message.rank]} worker failed to start: {message.text.splitlines()[0]}"
            elif message is not None:
                self._handle(message)
                continue
            if dead or time.monotonic() > deadline:
                self.close()
                raise WorkerStartError(dead or "the workers did not start in time")

    def startup_log(self) -> list[str]:
        """Each worker's startup line: its pool next to the context window, its pid and device."""
        return [self._startup[rank] for rank in range(len(ROLES))]

    def _admit(self, request: Request, request_id: str, prompt_ids: list[int]) -> Sequence:
        """Hand the checked request to both workers; answered 503 at the next step if the pair is down."""
        room = next(self._rooms)
        seq = Sequence.of(request, request_id, prompt_ids, self.page_keying, uid=room, room=room)
        self._take_news(0.0)
        if self.failure or self.stopping:
            reason = UNAVAILABLE if self.failure else "the server is shutting down"
            self._ended.append(Finished(seq, HTTPStatus.SERVICE_UNAVAILABLE, reason))
            return seq
        for commands in self._commands.values():
            commands.put(Admit(seq.copy_for_node()))
        return seq

    def _cancel(self, seq: Sequence) -> None:
        """Both workers retire the request at their next gate."""
        for commands in self._commands.values():
            commands.put(Cancel(seq.request_id))

    def _advance(self) -> list[Finished]:
        """Take the workers' news, waiting up to STEP_WAIT_S for the first."""
        self._take_news(STEP_WAIT_S)
        ended, self._ended = self._ended, []
        return ended

    def _take_news(self, wait_s: float) -> None:
        """Handle every message the workers sent (waiting up to `wait_s` for the first); check both live."""
        try:
            message = self._news.get(timeout=wait_s) if wait_s > 0 else self._news.get_nowait()
            while True:
                self._handle(message)
                message = self._news.get_nowait()
        except queue.Empty:
            pass
        self._watch_workers()

    def _handle(self, message: Ready | News | WorkerFailed) -> None:
        self.last_heard[message.rank] = time.monotonic()
        if isinstance(message, Ready):
            self._startup[message.rank] = message.startup_line
        elif isinstance(message, News):
            self.reports[message.rank] = message.report
            for request_id, ids in message.tokens.items():
                if request_id in self.seqs:
                    self.seqs[request_id].output_ids.extend(ids)
            if not self.failure:
                self._ended += [f for f in message.ended if f.seq.request_id in self.seqs]
        elif isinstance(message, WorkerFailed):
            self._fail(f"the {ROLES[message.rank]} worker failed: {message.text.splitlines()[0]}")

    def _watch_workers(self) -> None:
        """A worker that exited, or one silent for STALL_S (stopped, hung), takes the pair down."""
        if self.failure is not None or self.stopping:
            return
        silent = {rank: time.monotonic() - heard for rank, heard in self.last_heard.items()}
        stalled = next((f"the {ROLES[r]} worker (pid {self.workers[r].pid}) stopped answering: no message "
                        f"for {s:.0f} s" for r, s in silent.items() if s > STALL_S), None)
        if problem := self._dead_worker() or stalled:
            self._fail(problem)

    def _dead_worker(self) -> str | None:
        """Which worker has exited, and how, once all it said is in the news (its relay has ended)."""
        for rank, process in self.workers.items():
            if not self._relays[rank].is_alive():
                return f"the {ROLES[rank]} worker (pid {process.pid}) exited with code {process.exitcode}"
        return None

    def _fail(self, reason: str) -> None:
        """The pair is down: answer every live request 503 and stop the surviving worker."""
        if self.failure is not None:
            return
        self.failure = reason
        print(f"distributed cluster: {reason}; the pair is down, answering 503", file=sys.stderr, flush=True)
        ended = {f.seq.request_id for f in self._ended}
        self._ended += [Finished(seq, HTTPStatus.SERVICE_UNAVAILABLE, UNAVAILABLE)
                        for seq in self.seqs.values() if seq.request_id not in ended]
        # The 503s go out with this step; stopping a worker that does not answer takes STOP_TIMEOUT_S: aside.
        self._stopper = threading.Thread(target=stop_workers, args=(self.workers, self._commands, self._news),
                                         name="minikv-pair-stop", daemon=True)
        self._stopper.start()

    def node_reports(self) -> dict[str, dict]:
        """Each worker's report as it last sent it."""
        return {ROLES[rank]: report for rank, report in self.reports.items()}

    def health(self) -> dict:
        """The pair's health as the workers last reported it (news taken first: an idle server no longer
        steps, and pages are freed after the last answer), and whether each worker lives."""
        self._take_news(0.0)
        workers = {ROLES[rank]: {"pid": p.pid, "alive": p.is_alive(), "exitcode": p.exitcode}
                   for rank, p in self.workers.items()}
        return super().health() | {"workers": workers, "failure": self.failure}

    def close(self) -> None:
        """Stop both workers (a shutdown, not a failure). Safe to call twice."""
        self.stopping = True
        if self._stopper is not None:
            self._stopper.join()
        stop_workers(self.workers, self._commands, self._news)


def relay(outbox: multiprocessing.Queue, news: queue.Queue, worker: multiprocessing.Process) -> None:
    """Move one worker's messages into the front door's news until the worker has exited and all it said
    is read. Each worker writes a queue of its own: a multiprocessing.Queue's writers share one lock, so a
    worker stopped while it writes (SIGSTOP, a debugger) would silence the other worker too."""
    while True:
        exited = bool(multiprocessing.connection.wait([worker.sentinel], timeout=0))  # before the read
        try:
            news.put(outbox.get(timeout=0.1))
        except queue.Empty:
            if exited:
                return


def stop_workers(workers: dict[int, multiprocessing.Process], commands: dict[int, multiprocessing.Queue],
                 news: queue.Queue) -> None:
    """Ask each live worker to stop, keep reading its news (a worker exits only once its queue is
    flushed) until both are gone, kill one that outstays STOP_TIMEOUT_S."""
    for rank, process in workers.items():
        if process.is_alive():
            commands[rank].put(Stop())
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(p.is_alive() for p in workers.values()) and time.monotonic() < deadline:
        try:
            news.get(timeout=0.05)  # dropped: nobody is waiting for it any more
        except queue.Empty:
            pass
    for process in workers.values():
        if process.is_alive():
            process.kill()
        process.join(STOP_TIMEOUT_S)
    for queue_ in commands.values():
        queue_.cancel_join_thread()  # a dead worker never reads what is left: do not wait on it at exit
