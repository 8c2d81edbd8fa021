"""`minikv serve` as a server: what idle, slow and surplus connections cost it (docs/serve.md)."""

from __future__ import annotations

import selectors
import socket
import time

import httpx
import pytest

from minikv.logs.gateway_log import GatewayRecord, iter_log
from minikv.serve.connections import BODY_TIMEOUT_S, HEADER_TIMEOUT_S
from minikv.serve.launch import ServerProcess

MODEL = "tiny-llama"
KEY = "sk-conn-0001"
CLOSED_WITHIN_S = 10.0  # what the server promises for a connection that never sends a whole request head


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("conn") / "gateway.jsonl"
    with ServerProcess(["--api-key", f"alice={KEY}", "--log", str(log)]) as s:
        s.log = log
        yield s


def answered(server, prompt: str = "alice: save pin 4821.\n") -> str:
    """A legitimate client's reply text."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 20}
    r = httpx.post(server.base_url + "/completions", json=body,
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def rows(server) -> list[GatewayRecord]:
    return [r for r in iter_log(server.log) if isinstance(r, GatewayRecord)]


def open_sockets(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setblocking(False)
        socks.append(s)
    return socks


def wait_closed(idle: list[socket.socket], slow: list[socket.socket],
                limit_s: float) -> dict[socket.socket, float]:
    """When the server closed each socket (seconds from now), the slow ones sending a header line a second
    meanwhile; stops by itself after `limit_s`."""
    start, closed, next_send = time.monotonic(), {}, 0.0
    sel = selectors.DefaultSelector()
    for s in idle + slow:
        sel.register(s, selectors.EVENT_READ)
    while len(closed) < len(idle) + len(slow) and time.monotonic() - start < limit_s:
        now = time.monotonic() - start
        if now >= next_send:  # slowloris: the head grows, never ends
            for s in slow:
                if s not in closed:
                    try:
                        s.send(b"X-Slow: 1\r\n")
                    except OSError:
                        closed[s] = now
            next_send = now + 1.0
        for key, _ in sel.select(timeout=0.2):
            try:
                data = key.fileobj.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data and key.fileobj not in closed:
                closed[key.fileobj] = time.monotonic() - start
                sel.unregister(key.fileobj)
    sel.close()
    return closed


def test_idle_and_slow_connections_are_closed_and_a_client_is_answered_beside_500(server):
    """250 sockets that send nothing and 250 that send their headers a line a second: a client is answered
    beside them, and the server closes every one of the 500 within 10 s."""
    assert HEADER_TIMEOUT_S < CLOSED_WITHIN_S
    idle = open_sockets(server.port, 250)
    slow = open_sockets(server.port, 250)
    try:
        for s in slow:
            s.send(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert answered(server) == "saved pin 4821."
        closed = wait_closed(idle, slow, CLOSED_WITHIN_S + 2)
        last = max(closed.values(), default=0.0)
        assert len(closed) == 500 and last < CLOSED_WITHIN_S, (len(closed), last)
    finally:
        for s in idle + slow:
            s.close()
    assert answered(server) == "saved pin 4821."


class DescriptorLimited(ServerProcess):
    """A server whose process may hold at most `nofile` descriptors (prlimit, hard and soft)."""

    nofile = 256

    def start(self, command, env, output, new_session=False) -> None:
        super().start(["prlimit", f"--nofile={self.nofile}", "--", *command], env, output, new_session)


def test_at_the_descriptor_limit_one_line_not_a_traceback_per_accept():
    """400 sockets at a server limited to 256 descriptors: a line or two in its log, no traceback, and
    once they are gone it answers again."""
    with DescriptorLimited(["--api-key", f"alice={KEY}"]) as s:
        before = len(s.output())
        socks = open_sockets(s.port, 400)
        try:
            time.sleep(3.0)  # the accept loop's retries, thousands a second before
            said = s.output()[before:]
        finally:
            for sock in socks:
                sock.close()
        assert "Traceback" not in said and len(said.splitlines()) <= 2, said[:2000]
        assert "descriptor limit" in said or "connections open (the cap)" in said, said
        assert answered(s) == "saved pin 4821."


def test_the_gateway_log_is_the_owners_alone(server):
    """The log holds every reply in clear text: created 0600, whatever the umask (022 made it 0644)."""
    answered(server)
    assert server.log.stat().st_mode & 0o777 == 0o600, oct(server.log.stat().st_mode)


def test_a_499_row_counts_the_prompt(server):
    """The client of a long non-streamed reply leaves: its 499 row counts the prompt's tokens, not 0."""
    prompt = "1 2 3 4 5 6 7 8 9 10 11 12"  # the model goes on counting
    before = len(rows(server))
    with pytest.raises(httpx.TimeoutException):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 900}
        httpx.post(server.base_url + "/completions", json=body,
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=httpx.Timeout(60, read=0.6))
    deadline = time.monotonic() + 10
    while len(rows(server)) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    new = rows(server)[before:]
    assert [(r.status, r.prompt_tokens) for r in new] == [(499, len(prompt))]  # one token a character


def test_a_half_closed_client_is_logged_as_gone_not_as_served(server):
    """A client sends its request and shuts down its write side: TCP shows a FIN, as for a client that left.
    The server takes it for gone (nginx's 499): it sends nothing and logs 499 with no text, not 200."""
    before = len(rows(server))
    body = b'{"model": "tiny-llama", "prompt": "alice: save pin 7734.\\n", "max_tokens": 2}'  # before a poll
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as s:
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n")
        s.sendall(head.encode() + body)
        s.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
    deadline = time.monotonic() + 10
    while len(rows(server)) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    new = rows(server)[before:]
    assert [(r.status, r.response_text) for r in new] == [(499, "")], (new, received[:200])
    assert b"choices" not in received


def test_a_body_sent_a_byte_at_a_time_gets_a_408_within_its_deadline(server):
    """A client sends a whole head, then its body a byte a second: the server answers 408 once BODY_TIMEOUT_S
    has passed (not when the client pleases), logs it, and answers a legitimate client meanwhile."""
    before = len(rows(server))
    body = b'{"model": "tiny-llama", "prompt": "alice: save pin 7734.\\n", "max_tokens": 2}'
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(head.encode())
        s.setblocking(False)
        start, received, sent = time.monotonic(), b"", 0
        while b"\r\n\r\n" not in received and time.monotonic() - start < BODY_TIMEOUT_S + 5:
            if sent < len(body) - 1 and time.monotonic() - start >= sent:  # one byte a second, never the last
                s.send(body[sent:sent + 1])
                sent += 1
            if sent == 2:
                assert answered(server) == "saved pin 4821."
            try:
                received += s.recv(4096)
            except BlockingIOError:
                time.sleep(0.05)
        waited = time.monotonic() - start
    assert received.startswith(b"HTTP/1.1 408"), received[:200]
    assert BODY_TIMEOUT_S - 1 <= waited < BODY_TIMEOUT_S + 5, waited
    assert b"request_timeout" in received
    assert [r.status for r in rows(server)[before:] if r.status != 200] == [408]
