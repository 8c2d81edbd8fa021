"""The engine core, as vLLM's: the one loop that owns the front door (`Engine`, `Cluster` or `DistCluster`),
takes Submit/Cancel/Drain/Stop from its inbox and puts one StepOutput a step (new token ids, the answers
finished, the stats /health shows) in its outbox. The same loop and messages serve a process of its own
(`core_main`, `minikv serve`) and a thread (ServerThread); only the queues differ."""

import argparse
import queue
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus

from minikv.disagg.dist.child import HEARTBEAT_S, exit_now, ignore_group_signals, parent_alive
from minikv.disagg.dist.messages import Stop  # the pair's own: one Stop for every loop
from minikv.engine.front_door import FrontDoor
from minikv.engine.request import Request, Response, error_response

IDLE_WAIT_S = 0.05  # how long the idle loop waits for a command before looking again
SHUTTING_DOWN = "the server is shutting down"


@dataclass(frozen=True)
class Submit:
    """A request the HTTP side checked and tokenized; `key` names it in every message about it."""
    key: int
    request: Request
    prompt_ids: list[int]


@dataclass(frozen=True)
class Cancel:
    """The client went away: free the request's pages at the next step."""
    key: int


@dataclass(frozen=True)
class Drain:
    """SIGTERM: take no new request; end those still running with a 503 after `grace_s`."""
    grace_s: float


@dataclass(frozen=True)
class Ready:
    """The core process loaded its model and built its door: what the server prints, and the window."""
    startup_lines: list[str]
    context_len: int


@dataclass(frozen=True)
class CoreFailed:
    """The core process could not start: one line saying why."""
    reason: str


@dataclass(frozen=True)
class StepOutput:
    """One step: each live request's new token ids, the answers finished in it, and what /health shows."""
    tokens: dict[int, list[int]] = field(default_factory=dict)  # key -> ids generated in this step
    finished: list[tuple[int, Response]] = field(default_factory=list)  # (key, its one Response)
    stats: dict = field(default_factory=dict)


class CoreLoop:
    """The loop's state: each key's engine id, how many tokens each has been sent, the drain deadline."""

    def __init__(self, door: FrontDoor, outbox) -> None:
        self.door, self.outbox = door, outbox
        self.engine_ids: dict[int, str] = {}  # key -> engine id, while the request is live
        self.keys: dict[str, int] = {}  # engine id -> key
        self.sent: dict[int, int] = {}  # key -> tokens already in a StepOutput
        self.drain_at: float | None = None  # set by Drain: no new request; at this time, 503 for the rest
        self.stopping = False
        self.steps = 0
        self.out = StepOutput()  # this step's message, filled as the step goes
        self.last_stats: dict = {}
        self.last_sent_s = 0.0

    def run(self, inbox, alive: Callable[[], bool]) -> None:
        """Step until told to Stop or `alive()` says the HTTP side is gone; then answer the rest 503."""
        while not self.stopping and alive():
            try:
                self.take_commands(inbox, block=not self.door.has_work())
                if self.door.has_work():
                    self.step()
                if self.drain_at is not None and time.monotonic() >= self.drain_at:
                    self.refuse_live(HTTPStatus.SERVICE_UNAVAILABLE, SHUTTING_DOWN)
            except Exception as e:  # a bug must end the requests it touched, never the server
                print(f"engine core: step failed ({type(e).__name__}); answering live requests 500",
                      file=sys.stderr)
                self.refuse_live(HTTPStatus.INTERNAL_SERVER_ERROR, f"engine error: {type(e).__name__}")
            self.publish()
        self.refuse_live(HTTPStatus.SERVICE_UNAVAILABLE, SHUTTING_DOWN)
        self.stopping = True
        self.take_commands(inbox, block=False)  # Submits still queued: answered 503 by `submit`
        self.publish(force=True)
        self.door.close()  # the distributed cluster's workers stop here; nothing else holds processes

    def take_commands(self, inbox, block: bool) -> None:
        """Apply every command waiting in the inbox (waiting a moment for the first when `block`)."""
        try:
            command = inbox.get(timeout=IDLE_WAIT_S) if block else inbox.get_nowait()
            while True:
                if isinstance(command, Submit):
                    self.submit(command)
                elif isinstance(command, Cancel) and command.key in self.engine_ids:
                    self.door.cancel(self.engine_ids[command.key])
                elif isinstance(command, Drain) and self.drain_at is None:
                    self.drain_at = time.monotonic() + command.grace_s
                elif isinstance(command, Stop):
                    self.stopping = True
                command = inbox.get_nowait()
        except queue.Empty:
            return

    def submit(self, command: Submit) -> None:
        if self.stopping or self.drain_at is not None:
            self.refuse(command, HTTPStatus.SERVICE_UNAVAILABLE, SHUTTING_DOWN)
            return
        try:
            engine_id = self.door.submit(command.request, command.prompt_ids)
        except Exception as e:  # the door answers bad requests 400 itself: a bug, this request's alone
            print(f"engine core: submit failed ({type(e).__name__})", file=sys.stderr)
            self.refuse(command, HTTPStatus.INTERNAL_SERVER_ERROR, f"engine error: {type(e).__name__}")
            return
        self.engine_ids[command.key], self.keys[engine_id], self.sent[command.key] = engine_id, command.key, 0

    def step(self) -> None:
        """One step of the door: the answers it finished, then each live request's new token ids."""
        done = self.door.step()
        self.steps += 1
        for response in done:
            if (key := self.keys.pop(response.request_id, None)) is not None:
                del self.engine_ids[key], self.sent[key]
                self.out.finished.append((key, response))
        for key, engine_id in self.engine_ids.items():
            seq = self.door.seqs.get(engine_id)
            if seq is not None and len(seq.output_ids) > self.sent[key]:
                self.out.tokens[key] = seq.output_ids[self.sent[key]:]
                self.sent[key] = len(seq.output_ids)

    def refuse(self, command: Submit, status: HTTPStatus, reason: str) -> None:
        self.out.finished.append((command.key, error_response("-", command.request.tenant, status, reason)))

    def refuse_live(self, status: HTTPStatus, reason: str) -> None:
        """End every live request with `status` (its engine request cancelled, so its pages come back)."""
        for key, engine_id in self.engine_ids.items():
            try:
                self.door.cancel(engine_id)
            except Exception:  # noqa: BLE001 - a broken door still owes every client an answer
                pass
            self.out.finished.append((key, error_response(engine_id, "-", status, reason)))
        self.engine_ids.clear(), self.keys.clear(), self.sent.clear()

    def publish(self, force: bool = False) -> None:
        """This step's StepOutput, if it says anything new (or a heartbeat is due)."""
        stats = self.door.health() | {"live_requests": len(self.engine_ids), "steps": self.steps}
        news = self.out.tokens or self.out.finished or stats != self.last_stats
        if force or news or time.monotonic() - self.last_sent_s > HEARTBEAT_S:
            self.outbox.put(StepOutput(self.out.tokens, self.out.finished, stats))
            self.out, self.last_stats, self.last_sent_s = StepOutput(), stats, time.monotonic()


def core_main(args: argparse.Namespace, inbox, outbox, parent_pid: int) -> None:
    """The core process's entry point: load the model, build the door `minikv serve ARGS` asks for, say Ready
    (or CoreFailed), then loop."""
    import torch

    from minikv.model.checkpoint import load_model
    from minikv.serve.backend import start_door, startup_lines
    from minikv.serve.flags import check_args
    ignore_group_signals()
    try:
        torch.set_num_threads(args.threads)
        model, tokenizer = load_model(args.model, args.device)
        keys, switches = check_args(args)
        door = start_door(args, keys, switches, model, tokenizer)
    except Exception as e:  # noqa: BLE001 - a ValueError names what is wrong; anything else, its type too
        why = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
        reason = str(e) if isinstance(e, ValueError) else why
        outbox.put(CoreFailed(reason))
        exit_now(outbox)
    outbox.put(Ready(startup_lines(args, door, switches, keys), door.config.context_len))
    try:
        CoreLoop(door, outbox).run(inbox, lambda: parent_alive(parent_pid))
    finally:
        exit_now(outbox)
