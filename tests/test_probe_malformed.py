"""`minikv probe` against malformed endpoints: one line, exit 2, within --time-limit, never a traceback.

Each case is a fake endpoint (tests/fake_endpoint.py) that gets one thing wrong; the probe runs
through the real command line, in this process, on a thread it must leave by itself in time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from fake_endpoint import (MODELS, FakeEndpoint, events, honest_completion, honest_usage, reply, reset,
                           start_stream)

import minikv.probe.run  # noqa: F401  (scipy and httpx imported here, not inside the timed runs)
from minikv.cli import main

KEYS = ["--key", "sk-alice-0001", "--key", "sk-bob-0002"]
TIME_LIMIT_S = 3.0
HANG_MARGIN_S = 2.0  # a bound on a hang, not a performance figure: the probe must stop by itself


def models_with(**card) -> dict:
    return {"data": [{"id": "fake", **card}]}


def usage_with(**changes):
    """Completions whose usage has some fields replaced (None: removed)."""
    def route(h, body):
        usage = {k: v for k, v in {**honest_usage(body), **changes}.items() if v is not None}
        honest_completion(h, body, usage)
    return route


def forever(chunk: bytes, every_s: float, content_type: str = "text/event-stream", head: bytes = b""):
    """A 200 whose body never ends: `chunk` every `every_s` seconds until the client leaves."""
    def route(h, body):
        start_stream(h, content_type)
        h.wfile.write(head)
        try:
            while not h.server.stopping.wait(every_s):
                h.wfile.write(chunk)
                h.wfile.flush()
        except OSError:
            pass
    return route


def hang(h, body) -> None:
    h.server.stopping.wait()


def raw(data: bytes):
    def route(h, body):
        h.close_connection = True
        h.wfile.write(data)
    return route


def reset_after(data: bytes):
    def route(h, body):
        start_stream(h)
        h.wfile.write(data)
        reset(h)
    return route


def truncated(h, body) -> None:
    h.close_connection = True
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Content-Length", "1000")
    h.end_headers()
    h.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')


def malformed_when_long(h, body) -> None:
    """Honest for the calibration's short prompts; usage as a list once prompts grow (mid-check)."""
    if len(body["prompt"]) < 200:
        honest_completion(h, body)
    else:
        events(h, {"choices": [{"text": "x"}]}, {"usage": [1, 2]})


HTML = "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head>\n<body><h1>Bad Gateway</h1></body></html>"
M, C = "models", "completions"
CASES = {  # name: (route, what it does, extra arguments, words the one-line error holds)
    "models data is a dict": (M, lambda h, b: reply(h, 200, {"data": {"id": "fake"}}), [], "list of model objects"),
    "models data is a list of strings": (M, lambda h, b: reply(h, 200, {"data": ["fake"]}), [], "list of model objects"),
    "models answer is a JSON list": (M, lambda h, b: reply(h, 200, [{"id": "fake"}]), [], "list of model objects"),
    "models answer is not JSON": (M, lambda h, b: reply(h, 200, "hello", "text/plain"), [], "not JSON"),
    "models answer is an HTML page": (M, lambda h, b: reply(h, 200, HTML, "text/html"), [], "not JSON"),
    "models answer is an HTML 502": (M, lambda h, b: reply(h, 502, HTML, "text/html"), [], "answered 502"),
    "models answer is a redirect": (M, lambda h, b: reply(h, 302, "", headers={"Location": "http://example.com/"}), [], "answered 302"),
    "models list is empty": (M, lambda h, b: reply(h, 200, {"data": []}), [], "lists no model"),
    "model id is a number": (M, lambda h, b: reply(h, 200, {"data": [{"id": 7}]}), [], "id"),
    "max_model_len is a string": (M, lambda h, b: reply(h, 200, models_with(max_model_len="1024")), [], "'1024'"),
    "max_model_len is 10**9": (M, lambda h, b: reply(h, 200, models_with(max_model_len=10**9)), [], "1,000,000,000"),
    "max_model_len is negative": (M, lambda h, b: reply(h, 200, models_with(max_model_len=-1)), [], "-1"),
    "max_model_len is missing": (M, lambda h, b: reply(h, 200, models_with()), [], "does not advertise"),
    "models body never ends": (M, forever(b" " * 65536, 0, "application/json", b'{"data": ['), [], "MiB"),
    "models never answers": (M, hang, [], "time limit"),
    "--context below what the probe needs": (M, lambda h, b: reply(h, 200, MODELS), ["--context", "10"], "--context 10"),
    "--model not listed": (M, lambda h, b: reply(h, 200, MODELS), ["--model", "gpt-4"], "does not list 'gpt-4'"),
    "usage is a list": (C, lambda h, b: events(h, {"choices": [{"text": "x"}]}, {"usage": [16, 1]}), [], "usage is an array"),
    "prompt_tokens_details is a list": (C, usage_with(prompt_tokens_details=[0]), [], "prompt_tokens_details is an array"),
    "prompt_tokens is a string": (C, lambda h, b: usage_with(prompt_tokens=str(len(b["prompt"])))(h, b), [], "not a token count"),
    "prompt_tokens is a float": (C, lambda h, b: usage_with(prompt_tokens=len(b["prompt"]) + 0.5)(h, b), [], "not a token count"),
    "prompt_tokens is negative": (C, usage_with(prompt_tokens=-3), [], "not a token count"),
    "prompt_tokens never grows": (C, usage_with(prompt_tokens=12), [], "does not grow"),
    "cached_tokens is a string": (C, usage_with(prompt_tokens_details={"cached_tokens": "0"}), [], "not a token count"),
    "an event is a JSON list": (C, lambda h, b: events(h, [1, 2]), [], "event is an array"),
    "an event is a JSON string": (C, lambda h, b: events(h, '"hello"'), [], "event is a string"),
    "an event is not JSON": (C, lambda h, b: events(h, "{not json"), [], "not JSON"),
    "stream error is a string": (C, lambda h, b: events(h, {"error": "overloaded"}), [], "overloaded"),
    "choices is a dict": (C, lambda h, b: events(h, {"choices": {"text": "x"}}), [], "choices is an object"),
    "choice text is a number": (C, lambda h, b: events(h, {"choices": [{"text": 5}]}), [], "text is a number"),
    "not a stream but JSON": (C, lambda h, b: reply(h, 200, {"choices": [{"text": "x"}], "usage": honest_usage(b)}), [],
                              "no server-sent events"),
    "wrong content type, plain text": (C, lambda h, b: reply(h, 200, "hello world", "text/plain"), [], "no server-sent events"),
    "completions answer an HTML 500": (C, lambda h, b: reply(h, 500, HTML, "text/html"), [], "500"),
    "completions answer a JSON 503": (C, lambda h, b: reply(h, 503, {"error": {"message": "busy", "code": 5}}), [], "busy"),
    "huge error body": (C, lambda h, b: reply(h, 500, b"E" * (64 << 20), "text/plain"), [], "500"),
    "connection reset before any reply": (C, lambda h, b: reset(h), [], "failed"),
    "connection reset mid-stream": (C, reset_after(b'data: {"choices": [{"text": "x"}]}\n\n'), [], "failed"),
    "stream shorter than its Content-Length": (C, truncated, [], "failed"),
    "stream ends without [DONE]": (C, lambda h, b: events(h, {"choices": [{"text": "x"}]}, done=False), [], "[DONE]"),
    "not HTTP at all": (C, raw(b"hello\r\n\r\n"), [], "failed"),
    "keep-alive every 0.5 s forever": (C, forever(b": keep-alive\n\n", 0.5), [], "time limit"),
    "keep-alive just under the time limit": (C, forever(b": keep-alive\n\n", TIME_LIMIT_S - 0.4), [], "time limit"),
    "completions never answer": (C, hang, [], "time limit"),
    "events as fast as it can, forever": (C, forever(b'data: {"choices": [{"text": "xxxxxxxx"}]}\n\n' * 64, 0), [], "MiB"),
    "one endless line": (C, forever(b"x" * 65536, 0), [], "MiB"),
    "bytes that are not UTF-8": (C, lambda h, b: (start_stream(h), h.wfile.write(b"data: \xff\xfe{}\n\n")), [], "not JSON"),
    "usage turns into a list mid-check": (C, malformed_when_long, [], "usage is an array"),
}


def run_cli(args: list[str], capsys) -> tuple[int | None, str, str, float]:
    """`python -m minikv probe ARGS` in this process, on a thread; (exit status or None if still running, out, err, s)."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["status"] = main(["probe", *args])
        except BaseException as e:  # noqa: BLE001 - a traceback is what the test looks for
            outcome["raised"] = e

    start = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(TIME_LIMIT_S + HANG_MARGIN_S + 10)
    elapsed = time.monotonic() - start
    out, err = capsys.readouterr()
    if "raised" in outcome:
        raise AssertionError(f"the probe raised {outcome['raised']!r}") from outcome["raised"]
    return outcome.get("status"), out, err, elapsed


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_endpoint_is_one_line_exit_2_in_time(case, capsys):
    """Every malformed endpoint: exit 2, one line on stderr naming the problem, no traceback, within the limit."""
    route, handler, extra, words = CASES[case]
    with FakeEndpoint(**{route: handler}) as fake:
        status, out, err, elapsed = run_cli([fake.url, *KEYS, "--seed", "0", "--json",
                                             "--time-limit", str(TIME_LIMIT_S), *extra], capsys)
    assert status == 2, f"exit {status} after {elapsed:.1f} s; stderr: {err!r}"
    assert elapsed < TIME_LIMIT_S + HANG_MARGIN_S, f"{elapsed:.1f} s for a {TIME_LIMIT_S} s limit"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "internal error" not in lines[0], err
    assert words in lines[0], lines[0]
    assert out == ""  # --json: nothing half-written on stdout


def test_at_least_thirty_malformed_endpoints():
    assert len(CASES) >= 30


@pytest.mark.parametrize("url", ["http://[::1", "ftp://127.0.0.1/", "127.0.0.1:8000", "http://"])
def test_malformed_url_is_one_line_exit_2(url, capsys):
    """A URL that is not an http(s) URL with a host: one line, exit 2, nothing sent."""
    status, out, err, _ = run_cli([url, *KEYS], capsys)
    assert status == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "URL" in err and "internal error" not in err


@pytest.mark.parametrize("limit", ["0", "-1", "nan", "inf"])
def test_time_limit_must_be_finite_and_positive(limit, capsys):
    status, _, err, _ = run_cli(["http://127.0.0.1:1", *KEYS, "--time-limit", limit], capsys)
    assert status == 2 and err.startswith("error: --time-limit"), err


def test_an_honest_fake_endpoint_is_probed_to_the_end(capsys):
    """The fake's default replies are good enough to probe: every check reaches a verdict (the control). It
    serves prompts past the max_model_len it advertises, so the over-length check fails: exit 1. (Its replies
    take no time per prompt token, so whether prompt-token honesty passes is a race, and not asserted.)"""
    with FakeEndpoint() as fake:
        status, out, err, _ = run_cli([fake.url, *KEYS, "--seed", "0", "--json", "--rounds", "5"], capsys)
    verdicts = {c["name"]: c["verdict"] for c in json.loads(out)["checks"]}
    assert verdicts["over-length"] == "fail" and set(verdicts.values()) <= {"pass", "fail"}, err
    assert status == 1, err


def test_the_command_line_itself_against_a_keep_alive_stream():
    """The real `python -m minikv probe` process, as a user runs it: one line, exit 2, and gone within the
    time limit of its first request (timed at the endpoint, so the interpreter's start does not count)."""
    first_request: list[float] = []

    def models(h, body) -> None:
        first_request.append(time.monotonic())
        reply(h, 200, MODELS)

    with FakeEndpoint(models=models, completions=forever(b": keep-alive\n\n", 0.5)) as fake:
        r = subprocess.run([sys.executable, "-m", "minikv", "probe", fake.url, *KEYS, "--time-limit", str(TIME_LIMIT_S)],
                           capture_output=True, text=True, timeout=120)
        ended = time.monotonic()
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    assert first_request and ended - first_request[0] < TIME_LIMIT_S + HANG_MARGIN_S


def test_command_and_run_import_one_way():
    """The command line reads its defaults without loading the probe; the probe never imports the command line."""
    code = ("import sys, minikv.probe.command; assert 'minikv.probe.run' not in sys.modules and 'scipy' not in sys.modules; "
            "import minikv.probe.run; assert minikv.probe.run.__name__")
    fresh = ("import sys, minikv.probe.run; assert 'minikv.probe.command' not in sys.modules, "
             "'minikv.probe.run imports minikv.probe.command'")
    for source in (code, fresh):
        r = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
