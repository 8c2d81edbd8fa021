"""A fake OpenAI-compatible endpoint on a free loopback port, misbehaving as each test chooses.

By default it answers like an honest server without a prefix cache: `/v1/models` lists one model
with `max_model_len` 1024, and `/v1/completions` streams one text event, then usage (one token per
prompt character, as the shipped tokenizer counts), then `[DONE]`. A test replaces either route
with a function `(handler, body) -> None` that writes whatever reply it wants, down to the raw bytes.

    with FakeEndpoint(completions=lambda h, body: reply(h, 500, "<html>oops</html>")) as fake:
        ... probe fake.url ...
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Route = Callable[[BaseHTTPRequestHandler, dict], None]
MODELS = {"object": "list", "data": [{"id": "fake", "object": "model", "max_model_len": 1024}]}


def reply(h: BaseHTTPRequestHandler, status: int, body: bytes | str | dict | list,
          content_type: str = "application/json", headers: dict[str, str] | None = None) -> None:
    """A whole reply with a Content-Length; a dict or list is sent as JSON."""
    data = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
    h.send_response(status)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items():
        h.send_header(name, value)
    h.end_headers()
    h.wfile.write(data)


def start_stream(h: BaseHTTPRequestHandler, content_type: str = "text/event-stream") -> None:
    """Headers of a reply whose body runs until the connection closes (HTTP/1.0 style)."""
    h.close_connection = True
    h.send_response(200)
    h.send_header("Content-Type", content_type)
    h.end_headers()


def events(h: BaseHTTPRequestHandler, *items: object, done: bool = True) -> None:
    """A server-sent event stream: each item JSON-encoded (a str is sent as it is), then [DONE]."""
    start_stream(h)
    for item in items:
        h.wfile.write(f"data: {item if isinstance(item, str) else json.dumps(item)}\n\n".encode())
    if done:
        h.wfile.write(b"data: [DONE]\n\n")


def honest_usage(body: dict) -> dict:
    """Usage as an honest server without a cache reports it: one token per prompt character."""
    tokens = len(body.get("prompt", ""))
    return {"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1,
            "prompt_tokens_details": {"cached_tokens": 0}}


def honest_completion(h: BaseHTTPRequestHandler, body: dict, usage: dict | None = None) -> None:
    events(h, {"choices": [{"index": 0, "text": "x"}]}, {"choices": [], "usage": usage or honest_usage(body)})


def reset(h: BaseHTTPRequestHandler) -> None:
    """Close the connection with a TCP reset (SO_LINGER 0), whatever was sent so far."""
    h.wfile.flush()
    h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    h.connection.close()
    h.close_connection = True


class FakeEndpoint:
    """`ThreadingHTTPServer` on 127.0.0.1, on a thread; a context manager that stops it."""

    def __init__(self, models: Route | None = None, completions: Route | None = None) -> None:
        routes = {"/v1/models": models or (lambda h, body: reply(h, 200, MODELS)),
                  "/v1/completions": completions or honest_completion}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                route = routes.get(self.path.split("?")[0])
                if route is None:
                    reply(self, 404, {"error": {"message": "not found"}})
                else:
                    route(self, body)

            do_GET = do_POST = handle_one

            def log_message(self, *args) -> None:  # quiet
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:  # a client that left: not news
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.stopping = threading.Event()  # a route that hangs waits on h.server.stopping
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), name="fake-endpoint", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "FakeEndpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
