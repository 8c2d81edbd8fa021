"""`minikv serve` runs its engine core in a process of its own: nothing is left behind when the server ends,
however it ends, and a core that dies or stalls is answered 503, live requests and new ones alike."""

import os
import queue
import signal
import threading
import time
from http import HTTPStatus

import httpx
import pytest

from minikv.disagg.dist.child import HEARTBEAT_S, STALL_S
from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.engine.request import Request, Sequence
from minikv.serve.core import Cancel, CoreLoop, StepOutput, Stop, Submit
from minikv.serve import engine_loop
from minikv.serve.engine_loop import EngineLoop
from minikv.serve.launch import ServerProcess
from processes import running

GONE_WITHIN_S = 5.0  # the core's parent-death check runs every loop: well under a second when idle
COUNTING = "1 2 3 4 5 6 7 8 9 10 11 12"  # greedy goes on counting: hundreds of tokens


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


def complete(server: ServerProcess, prompt: str = "Hello", max_tokens: int = 8) -> httpx.Response:
    return httpx.post(server.base_url + "/completions", json={"model": "tiny-llama", "prompt": prompt,
                                                              "max_tokens": max_tokens}, timeout=60)


def test_the_core_is_a_process_of_its_own():
    """The front door runs in another process than the HTTP server, which serves through it."""
    with ServerProcess([]) as server:
        core = server.health()["core"]
        assert core["runs_on"] == "process" and core["pid"] != server.process.pid and running(core["pid"])
        assert complete(server).status_code == HTTPStatus.OK


def test_sigterm_leaves_no_core_process():
    """SIGTERM: the server exits 0 and its core process is gone with it."""
    server = ServerProcess([])
    core_pid = server.health()["core"]["pid"]
    assert server.stop() == 0 and "server stopped" in server.output()
    assert gone_within(core_pid, GONE_WITHIN_S)


def test_sigkill_of_the_server_ends_its_core():
    """kill -9 of the HTTP process (no handler runs): the core sees its parent gone and exits by itself."""
    server = ServerProcess([])
    core_pid = server.health()["core"]["pid"]
    try:
        server.process.kill()
        server.process.wait()
        assert gone_within(core_pid, GONE_WITHIN_S), "the core process outlived its server"
    finally:
        if running(core_pid):
            os.kill(core_pid, signal.SIGKILL)


def test_a_killed_core_gives_503_to_live_and_new_requests():
    """kill -9 of the core mid-request: that request and the next get 503 in OpenAI's shape, /health says
    unavailable with 503, and the server says so once on its output."""
    with ServerProcess([]) as server:
        core_pid = server.health()["core"]["pid"]
        outcome: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: outcome.append(complete(server, COUNTING, 600)), daemon=True)
        thread.start()
        while server.health()["live_requests"] == 0 and thread.is_alive():
            time.sleep(0.01)
        os.kill(core_pid, signal.SIGKILL)
        thread.join(20)
        assert not thread.is_alive(), "the live request hung"
        assert outcome[0].status_code == HTTPStatus.SERVICE_UNAVAILABLE
        assert outcome[0].json()["error"]["code"] == "unavailable" and str(core_pid) not in outcome[0].text
        later = complete(server)
        assert later.status_code == HTTPStatus.SERVICE_UNAVAILABLE and "error" in later.json()
        health = httpx.get(server.url + "/health", timeout=5)
        assert health.status_code == HTTPStatus.SERVICE_UNAVAILABLE
        assert health.json() == {"status": "unavailable"}
        assert "engine core" in server.health()["failure"]
        assert server.stop() == 0
    assert server.output().count("answering 503 from now on") == 1


def test_a_stopped_core_is_detected_and_ended():
    """SIGSTOP of the core (alive, silent): after STALL_S a request is answered 503 and the core is killed."""
    with ServerProcess([]) as server:
        core_pid = server.health()["core"]["pid"]
        os.kill(core_pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            reply = complete(server)  # waits: the core takes it, but never answers
            assert reply.status_code == HTTPStatus.SERVICE_UNAVAILABLE
            waited = time.monotonic() - started
            assert STALL_S - HEARTBEAT_S <= waited < STALL_S + 10  # silent since its last heartbeat
            assert "stopped answering" in server.health()["failure"]
            assert gone_within(core_pid, GONE_WITHIN_S)
        finally:
            if running(core_pid):
                os.kill(core_pid, signal.SIGKILL)


class HalfWrittenCore:
    """A core that stopped halfway through writing a message: alive, silent, and a read of its outbox never
    returns (the reader has the message's length and waits for the rest)."""

    where, door, pid = "process", None, 0

    def __init__(self) -> None:
        self.inbox, self.ended = queue.Queue(), threading.Event()
        self.worker = threading.Thread(target=self.ended.wait, daemon=True)  # alive until end()
        self.outbox = self  # get() below

    def get(self, timeout: float | None = None) -> None:
        self.ended.wait()  # no timeout honoured: stuck in the middle of a message
        raise queue.Empty

    def start(self) -> None:
        self.worker.start()

    def end(self, timeout_s: float) -> None:
        self.ended.set()


def test_a_core_stopped_mid_message_is_still_declared_down(tiny, monkeypatch):
    """The reader waits forever for the rest of a half-written message; the watchdog, on a thread of its own,
    still sees the silence, answers 503 from then on and ends the core."""
    monkeypatch.setattr(engine_loop, "STALL_S", 0.5)
    core = HalfWrittenCore()
    loop = EngineLoop(core, tiny[1])
    loop.start()
    deadline = time.monotonic() + 10
    while loop.failure is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loop.failure is not None and "stopped answering" in loop.failure
    assert core.ended.is_set()


def test_one_step_is_one_message_with_every_live_request(tiny):
    """The core loop on plain queues: one StepOutput a step with every running request's new ids (a finished
    one's last token comes in its answer); those ids, decoded as the HTTP side does, begin the answer's
    text."""
    model, tok = tiny
    inbox, outbox = queue.Queue(), queue.Queue()
    loop = CoreLoop(Engine(model, tok, EngineConfig()), outbox)
    for key, max_tokens in ((1, 5), (2, 400)):
        inbox.put(Submit(key, Request(COUNTING, "anon", max_tokens), tok.encode(COUNTING)))
    loop.take_commands(inbox, block=False)
    for _ in range(8):
        loop.step()
        loop.publish()
    first = outbox.get_nowait()
    assert set(first.tokens) == {1, 2} and all(len(ids) == 1 for ids in first.tokens.values())
    inbox.put(Cancel(2))
    inbox.put(Stop())
    loop.run(inbox, lambda: True)
    messages = [first] + [outbox.get_nowait() for _ in range(outbox.qsize())]
    answers = dict(pair for m in messages for pair in m.finished)
    ids = {key: sum((m.tokens.get(key, []) for m in messages), []) for key in (1, 2)}
    assert answers[1].status == HTTPStatus.OK and len(ids[1]) == answers[1].usage.completion_tokens - 1 == 4
    view = Sequence.text_view(Request(COUNTING, "anon", 5), tok.encode(COUNTING))
    view.output_ids += ids[1]
    assert view.visible_text(tok) and answers[1].text.startswith(view.visible_text(tok))
    assert answers[2].status in (499, HTTPStatus.SERVICE_UNAVAILABLE) and len(ids[2]) >= 7
    assert all(m.stats["steps"] >= 1 for m in messages[1:]) and messages[-1].stats["live_requests"] == 0
