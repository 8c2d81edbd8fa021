"""The probe's HTTP client: streamed completions, timed from sending to the first event with text, within a
request budget and a deadline nothing the endpoint sends can hold it past (a watchdog shuts the socket),
reading a reply only up to `MAX_BODY_BYTES`."""

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http import HTTPStatus

import httpx

from minikv.probe.replies import (CannotProbe, Observation, StreamControl, error_body, error_observation, lines,
                                  read_stream)
from minikv.probe.report import Incomplete

REQUEST_TIMEOUT_S = 60.0  # the longest wait for any one read, inside the time limit
MAX_BODY_BYTES = 8 << 20  # no API reply the probe asks for comes near this
HTTP_FAILURES = {httpx.ReadError: "the connection broke during the reply",
                 httpx.WriteError: "the connection broke while sending",
                 httpx.RemoteProtocolError: "the reply is not HTTP, or was cut short"}


class OutOfBudget(Incomplete):
    """The request budget or the time limit is spent."""


def api_base(url: str) -> str:
    """`http://host:port`, `.../v1` or `.../v1/` -> `.../v1`; CannotProbe unless http(s) with a host."""
    try:
        parsed = httpx.URL(url.strip())
    except httpx.InvalidURL as e:
        raise CannotProbe(f"{url!r} is not a URL ({e})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise CannotProbe(f"{url!r} is not an http(s) URL with a host, e.g. http://127.0.0.1:8000")
    base = str(parsed).rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def key_salt(key: str) -> str:
    """The `cache_salt` a gateway that salts per tenant would send for `key`: a hash, never the key."""
    return hashlib.sha256(b"minikv probe cache_salt\0" + key.encode()).hexdigest()[:32]


def mask(key: str) -> str:
    """A key as the report shows it: enough to tell two apart, not enough to use."""
    return key[:3] + "..." + key[-2:] if len(key) > 8 else "***"


class ProbeClient:
    """Sends at most `budget` requests and none after `time_limit_s`; threads may share it."""

    def __init__(self, url: str, budget: int, time_limit_s: float, transport: httpx.BaseTransport | None = None,
                 salt_per_key: bool = False) -> None:
        self.base = api_base(url)
        self.budget, self.sent = budget, 0
        self.deadline = time.monotonic() + time_limit_s
        self.time_limit_s = time_limit_s
        self.model: str | None = None
        self.salt_per_key = salt_per_key
        self.http = httpx.Client(transport=transport)
        self.quirks: list[str] = []  # what the endpoint leaves out that the API allows, each once, in order met
        self._lock = threading.Lock()

    def close(self) -> None:
        self.http.close()

    def models(self, key: str) -> list[dict]:
        """GET /v1/models with `key`: the model objects; CannotProbe if unreachable, refused or malformed."""
        with self._request("GET", "models", key) as (r, chunks):
            if r.status_code != HTTPStatus.OK:
                raise CannotProbe(f"answered {r.status_code} for key {mask(key)}")
            try:
                body = json.loads(b"".join(chunks))
            except ValueError:
                raise CannotProbe(f"answered 200 with a body that is not JSON "
                                  f"(content-type {r.headers.get('content-type')!r})") from None
            data = body.get("data") if isinstance(body, dict) else None
            if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
                raise CannotProbe("did not return a list of model objects ({\"data\": [{\"id\": ...}]})")
            return data

    def complete(self, key: str, prompt: str, max_tokens: int, control: StreamControl | None = None) -> Observation:
        """POST /v1/completions, streamed, greedy: the reply, its usage and its timings."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        if self.salt_per_key:
            body["cache_salt"] = key_salt(key)
        start = time.perf_counter()
        with self._request("POST", "completions", key, body) as (r, chunks):
            if r.status_code != HTTPStatus.OK:
                return error_observation(r.status_code, error_body(chunks), time.perf_counter() - start)
            obs = read_stream(lines(chunks), start, r.headers.get("content-type"), control)
        for quirk in obs.quirks:
            self.met(quirk)
        return obs

    def met(self, quirk: str) -> None:
        """Record a peer quirk once."""
        with self._lock:
            if quirk not in self.quirks:
                self.quirks.append(quirk)

    @contextmanager
    def _request(self, method: str, path: str, key: str, body: dict | None = None):
        """(response, its body's chunks), one request of the budget; what goes wrong is CannotProbe or
        OutOfBudget. A watchdog shuts the socket at the deadline, so that a blocked read returns then."""
        url = f"{self.base}/{path}"
        timeout = self._spend()
        try:
            with self.http.stream(method, url, json=body, headers={"Authorization": f"Bearer {key}"},
                                  timeout=timeout) as r:
                stream = r.extensions.get("network_stream")
                sock = stream.get_extra_info("socket") if stream is not None else None
                timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), _shut, (sock,))
                timer.daemon = True
                if isinstance(sock, socket.socket):  # else a test transport: the checks between chunks suffice
                    timer.start()
                try:
                    yield r, self._chunks(r)
                finally:
                    timer.cancel()
        except httpx.HTTPError as e:
            if time.monotonic() >= self.deadline:
                raise self._late() from None
            if isinstance(e, httpx.ConnectError):
                raise CannotProbe(f"cannot reach {self.base}: nothing answers there") from None
            raise CannotProbe(f"{method} {url} failed: {HTTP_FAILURES.get(type(e), 'no reply')} "
                              f"({type(e).__name__})") from None
        except CannotProbe as e:
            raise CannotProbe(f"{method} {url}: {e}") from None

    def _spend(self) -> httpx.Timeout:
        """Count one request; the timeout it may use (never past the deadline)."""
        with self._lock:
            if self.sent >= self.budget:
                raise OutOfBudget(f"the request budget of {self.budget} is spent")
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise self._late()
            self.sent += 1
        return httpx.Timeout(min(REQUEST_TIMEOUT_S, left))

    def _late(self) -> OutOfBudget:
        return OutOfBudget(f"the time limit of {self.time_limit_s:g} s is reached")

    def _chunks(self, r: httpx.Response) -> Iterator[bytes]:
        """The body's bytes, up to MAX_BODY_BYTES; OutOfBudget once the deadline has passed."""
        size = 0
        for chunk in r.iter_bytes():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise CannotProbe(f"a reply of more than {MAX_BODY_BYTES >> 20} MiB: not an API answer")
            if time.monotonic() >= self.deadline:
                break
            yield chunk
        if time.monotonic() >= self.deadline:  # also when the watchdog ended the body early
            raise self._late()


def _shut(sock: socket.socket) -> None:
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's method, also under TLS
    except OSError:
        pass
