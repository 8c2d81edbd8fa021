"""`serve --disagg --transport distributed`: the prefill and decode workers as real processes behind the server."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import threading
import time
from http import HTTPStatus
from pathlib import Path

import httpx
import openai
import pytest
from test_probe import KEY_A, KEY_B, KEYS, probe, verdicts

from minikv.probe.report import FAIL, PASS
from minikv.disagg.dist import cluster as dist_cluster
from minikv.disagg.dist.worker import HEARTBEAT_S
from minikv.serve.launch import ServerProcess, ServerThread
from processes import running

MODEL = "tiny-llama"
SAFE = ["--disagg", "--preset", "safe", "--context-len", "672", *KEYS]
DISTRIBUTED = ["--transport", "distributed"]
PROMPTS = [(KEY_A if i % 2 else KEY_B, f"Request {i}: " + "the quick brown fox jumps over the lazy dog. " * (1 + i % 4))
           for i in range(20)]
ANSWER_TIMEOUT_S = 20  # a request to a pair with a dead worker must be answered well within this
COUNTING = "1 2 3 4 5 6 7 8 9 10 11 12"  # greedy goes on counting: hundreds of tokens without an end of text


def client(server, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=60)


def greedy_answers(server) -> list[tuple[str, int]]:
    """Text and completion tokens of the 20 greedy requests, one after another."""
    out = []
    for key, prompt in PROMPTS:
        r = client(server, key).completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        out.append((r.choices[0].text, r.usage.completion_tokens))
    return out


def process_tree(pid: int) -> list[int]:
    """`pid` and every descendant still running (read from /proc)."""
    tree, i = [pid], 0
    while i < len(tree):
        for task in Path(f"/proc/{tree[i]}/task").glob("*"):
            try:
                tree += [int(c) for c in (task / "children").read_text().split()]
            except FileNotFoundError:
                pass
        i += 1
    return tree


def listeners(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket that the processes of `pid`'s tree listen on."""
    inodes = set()
    for p in process_tree(pid):
        for fd in Path(f"/proc/{p}/fd").glob("*"):
            try:
                inodes.add(os.readlink(fd))
            except FileNotFoundError:
                pass
    found = set()
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            address, port = fields[1].split(":")
            if fields[3] == "0A" and f"socket:[{fields[9]}]" in inodes:  # 0A: LISTEN
                raw = bytes.fromhex(address)  # each 32-bit word in host (little-endian) order
                ip = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.add((str(ipaddress.ip_address(ip)), int(port, 16)))
    return found


def worker_pids(server) -> dict[str, int]:
    return {name: w["pid"] for name, w in server.health()["workers"].items()}


@pytest.fixture(scope="module")
def safe_server():
    with ServerProcess([*SAFE, *DISTRIBUTED]) as server:
        yield server


@pytest.fixture(scope="module")
def vulnerable_server():
    with ServerProcess(["--disagg", "--preset", "vulnerable", *KEYS, *DISTRIBUTED]) as server:
        yield server


def test_transport_without_disagg_is_a_clear_error():
    """`--transport distributed` needs the cluster: exit 2 with one line on stderr, before any model loads."""
    r = subprocess.run([sys.executable, "-m", "minikv", "serve", "--transport", "distributed"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "error: --transport distributed needs --disagg (the single engine has no transfer)"


def test_startup_log_has_both_workers(safe_server):
    """The server prints each worker's pool, pid and backend before it serves; partitioned for its two keys,
    the prefill pool is raised from 42 pages to 84, so that each tenant's quota holds the 672-token window."""
    out = safe_server.output()
    assert "[prefill] KV pool: 84 pages" in out and "gloo rank 0" in out
    assert "[decode] KV pool: 125 pages" in out and "gloo rank 1" in out
    assert "two worker processes" in out


def test_every_listener_of_the_pair_is_on_loopback(safe_server):
    """The server, both workers, their TCPStore and gloo's sockets: nothing listens outside loopback."""
    found = listeners(safe_server.process.pid)
    assert len(process_tree(safe_server.process.pid)) >= 3 and len(found) >= 3, found  # uvicorn, store, gloo
    assert ("127.0.0.1", safe_server.port) in found
    assert {ip for ip, _ in found} <= {"127.0.0.1", "::1"}, found


def test_greedy_answers_equal_the_in_process_server(safe_server, tiny):
    """20 greedy requests through the official client: the same text and usage as the in-process disaggregated server."""
    model, tokenizer = tiny
    with ServerThread(SAFE, model, tokenizer) as in_process:
        expected = greedy_answers(in_process)
    assert greedy_answers(safe_server) == expected
    assert sum(tokens for _, tokens in expected) > len(PROMPTS)  # the answers are not all empty


def test_streamed_text_joins_to_the_whole(safe_server):
    """Tokens streamed from the decode worker, joined, are the non-streamed answer."""
    c = client(safe_server)
    prompt = COUNTING
    whole = c.completions.create(model=MODEL, prompt=prompt, max_tokens=40).choices[0].text
    chunks = [ch.choices[0].text for ch in c.completions.create(model=MODEL, prompt=prompt, max_tokens=40, stream=True)]
    assert len([ch for ch in chunks if ch]) > 1 and "".join(chunks) == whole


def test_probe_passes_the_safe_distributed_server(safe_server):
    """Safe preset across processes: every probe check passes, as for the in-process server."""
    status, report, _ = probe(safe_server.url)
    assert status == 0 and set(verdicts(report).values()) == {PASS}


def test_pools_whole_after_draining(safe_server):
    """Once idle, both workers report every page free and no cross-tenant read."""
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while True:
        health = safe_server.health()
        whole = all(p["free_pages"] == p["total_pages"] > 0 for p in health["pools"].values())
        if whole or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert whole, health["pools"]
    assert health["live_requests"] == 0 and health["cross_tenant_reads"] == 0


def test_probe_fails_the_vulnerable_distributed_server(vulnerable_server):
    """Vulnerable preset across processes: over-length and canary fail, as for the in-process server."""
    status, report, _ = probe(vulnerable_server.url)
    v = verdicts(report)
    assert status == 1 and v["over-length"] == FAIL and v["canary"] == FAIL
    assert vulnerable_server.health()["cross_tenant_reads"] > 0  # the decode worker's audit saw it


def test_shutdown_stops_both_workers(vulnerable_server):
    """SIGTERM to the server: it exits 0 and neither worker process is left."""
    pids = worker_pids(vulnerable_server)
    assert all(running(pid) for pid in pids.values())
    assert vulnerable_server.stop() == 0
    assert not [name for name, pid in pids.items() if running(pid)]


def test_a_killed_worker_gives_503_not_a_hang(safe_server):
    """kill -9 of the decode worker mid-request: that request and the next get 503 promptly; /health says which died.

    It kills a worker of the module's safe server, so it runs last in this file.
    """
    server = safe_server
    pids = worker_pids(server)
    outcome: list[BaseException | str] = []

    def long_request() -> None:
        try:
            r = client(server).completions.create(model=MODEL, prompt=COUNTING, max_tokens=600)
            outcome.append(r.choices[0].text)
        except openai.APIStatusError as e:
            outcome.append(e)

    thread = threading.Thread(target=long_request, daemon=True)
    thread.start()
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while server.health()["live_requests"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(pids["decode"], signal.SIGKILL)
    thread.join(ANSWER_TIMEOUT_S)
    assert not thread.is_alive(), "the live request hung"
    assert isinstance(outcome[0], openai.APIStatusError) and outcome[0].status_code == HTTPStatus.SERVICE_UNAVAILABLE
    assert "pid" not in str(outcome[0]) and str(pids["decode"]) not in str(outcome[0])  # a client learns no pid
    with pytest.raises(openai.APIStatusError) as later:
        client(server, KEY_B).completions.create(model=MODEL, prompt="bob: save pin 1234.\n", max_tokens=8)
    assert later.value.status_code == HTTPStatus.SERVICE_UNAVAILABLE
    health = httpx.get(server.url + "/health", timeout=5)
    assert health.status_code == HTTPStatus.SERVICE_UNAVAILABLE and health.json() == {"status": "unavailable"}
    assert "decode worker" in server.health()["failure"]  # the details: only for the operator's key
    assert not running(pids["prefill"])  # the survivor is stopped: the pair is down
    assert server.stop() == 0 and not running(pids["decode"])


def test_a_stopped_worker_is_detected_and_gives_503(tiny):
    """SIGSTOP of the decode worker mid-request (it stays alive but answers nothing): after its stall timeout
    the pair is declared down and the request gets a 503, in this order: the stop, the 503, and only then the
    stopped worker's end (the front door posts the 503s before it waits out the worker's stop).

    It asserts the order of events, not a duration, at the server's own 10 s stall timeout."""
    assert 3 * HEARTBEAT_S <= dist_cluster.STALL_S
    with ServerThread(["--disagg", "--transport", "distributed", "--preset", "safe", "--context-len", "672",
                       "--api-key", f"alice={KEY_A}"], *tiny) as server:
        pids = worker_pids(server)
        stopped = threading.Event()
        outcome: list[tuple[BaseException | str, bool, bool]] = []  # (reply, after the stop?, decode there?)

        def long_request() -> None:
            try:
                reply: BaseException | str = client(server).completions.create(
                    model=MODEL, prompt=COUNTING, max_tokens=600).choices[0].text
            except openai.APIStatusError as e:
                reply = e
            outcome.append((reply, stopped.is_set(), running(pids["decode"])))

        thread = threading.Thread(target=long_request, daemon=True)
        thread.start()
        while server.health()["live_requests"] == 0 and thread.is_alive():
            time.sleep(0.01)
        os.kill(pids["decode"], signal.SIGSTOP)
        stopped.set()
        try:
            thread.join(dist_cluster.STALL_S + 30)
            assert not thread.is_alive(), "the live request hung behind a stopped worker"
            reply, after_stop, decode_there = outcome[0]
            assert isinstance(reply, openai.APIStatusError)
            assert reply.status_code == HTTPStatus.SERVICE_UNAVAILABLE
            assert after_stop and decode_there, outcome  # the 503: after the stop, before the worker's end
            failure = server.health()["failure"]
            assert "decode worker" in failure and "stopped answering" in failure
        finally:
            if running(pids["decode"]):  # the front door kills it in the end
                os.kill(pids["decode"], signal.SIGKILL)

