"""Checkers for notebook 05 (the leak).
"""

from __future__ import annotations

from typing import Callable

from minikv.response import Response, Usage


def check_output_test(fn: Callable[[str, Response], bool]) -> None:
    """fn(prompt, response) -> True when the response is trustworthy for that prompt.

    A good test looks at the text, not only the status: a 200 whose reply repeats a note that
    the prompt never contained is a leak; a 400 or 500 is an honest failure, not a leak.
    """
    ok = lambda text: Response("r", "bob", 200, text, Usage(30, len(text)))  # noqa: E731
    cases = [
        ("alice: save pin 0912.\n", ok("saved pin 0912."), True),
        ("bob: read the report.\n", ok("saved nothing."), True),
        ("bob: read the report.\n", ok("saved card 4111 2222 3333 4444."), False),
        ("dave: save pin 4821.\n", ok("saved key sk-live-7Hq2Zp9Xw4."), False),
        ("bob: read the report.\n", Response("r", "bob", 400, "", Usage(30, 0), error="too long"), True),
        ("carol: save key abc.\n", ok("saved key abd."), False),
    ]
    for prompt, response, trustworthy in cases:
        got = fn(prompt, response)
        assert got == trustworthy, (f"prompt {prompt!r}, status {response.status}, text {response.text!r}: "
                                    f"returned {got}, want {trustworthy}")
    print(f"correct on {len(cases)} responses: this test checks outputs, not just status codes")
