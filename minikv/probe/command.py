"""`python -m minikv probe URL --key KEY_A --key KEY_B [--model M] [--context N] [--json]`.

Runs the four checks in order and prints, for each, what it sent, what came back and a verdict.
Exit status: 0 every check passed, 1 a check failed, 2 the endpoint could not be probed (or a
check could not finish inside the budget). It never sends more than `--budget` requests or
runs past `--time-limit` seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from minikv.probe.canary import check_canary
from minikv.probe.client import CannotProbe, OutOfBudget, ProbeClient, mask
from minikv.probe.honesty import check_honesty
from minikv.probe.over_length import check_over_length
from minikv.probe.prefix_cache import check_prefix_cache
from minikv.probe.report import INCOMPLETE, PASS, CheckResult, exit_status
from minikv.probe.session import ProbeSession, calibrate

DEFAULT_BUDGET = 200
DEFAULT_TIME_LIMIT_S = 300.0
DEFAULT_ROUNDS = 20


def add_probe_arguments(parser: argparse.ArgumentParser, positive_int) -> None:
    parser.add_argument("url", metavar="URL", help="the endpoint, e.g. http://127.0.0.1:8000 (or .../v1)")
    parser.add_argument("--key", action="append", default=[], metavar="KEY", help="an API key you own; give exactly two (A, then B)")
    parser.add_argument("--model", help="model id (default: the first one /v1/models lists)")
    parser.add_argument("--context", type=positive_int, help="the advertised context window in tokens (default: max_model_len from /v1/models)")
    parser.add_argument("--budget", type=positive_int, default=DEFAULT_BUDGET, help="most requests to send (default %(default)s)")
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, metavar="SECONDS", help="stop after this long (default %(default)s)")
    parser.add_argument("--rounds", type=positive_int, default=DEFAULT_ROUNDS, help="rounds of the prefix-cache audit, 4 requests each (default %(default)s)")
    parser.add_argument("--seed", type=int, help="seed for the random prompts and canaries (default: fresh each run)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")


def checks(rounds: int) -> list[tuple[str, Callable[[ProbeSession, CheckResult], None]]]:
    """In the order they run: the canary first, while the pool holds little but key A's note."""
    return [
        ("canary", check_canary),
        ("over-length", check_over_length),
        ("prompt-token honesty", check_honesty),
        ("shared prefix cache", lambda s, r: check_prefix_cache(s, r, rounds)),
    ]


@dataclass
class ProbeReport:
    """Every check's result, and what the probe learned about the endpoint."""

    endpoint: str
    model: str | None
    context: int | None
    keys: list[str]  # masked
    requests_sent: int = 0
    results: list[CheckResult] = field(default_factory=list)

    @property
    def status(self) -> int:
        return exit_status(self.results)

    def verdicts(self) -> dict[str, str]:
        return {r.name: r.verdict for r in self.results}

    def to_json(self) -> dict:
        return {"endpoint": self.endpoint, "model": self.model, "context": self.context, "keys": self.keys,
                "requests_sent": self.requests_sent, "checks": [r.to_json() for r in self.results],
                "exit_status": self.status}

    def summary(self) -> str:
        failed = [r.name for r in self.results if r.verdict != PASS]
        return (f"{self.requests_sent} requests to {self.endpoint} ({self.model}, window {self.context:,} tokens): "
                + ("all checks passed" if not failed else f"not passed: {', '.join(failed)}"))


def open_session(client: ProbeClient, key_a: str, key_b: str, model: str | None, context: int | None,
                 seed: int | None) -> ProbeSession:
    """Both keys accepted, the model and its window known, the token scale measured."""
    listed = client.models(key_a)
    client.models(key_b)
    card = next((m for m in listed if m.get("id") == model), None) if model else (listed[0] if listed else None)
    if card is None and not model:
        raise CannotProbe("/v1/models lists no model; pass --model")
    client.model = model or card["id"]
    context = context or (card or {}).get("max_model_len") or (card or {}).get("context_length")
    if not isinstance(context, int) or context < 64:
        raise CannotProbe("the endpoint does not advertise its context window (max_model_len); pass --context N")
    rng = random.Random(seed)
    return ProbeSession(client, key_a, key_b, context, calibrate(client, key_a, rng), rng)


def probe_endpoint(url: str, key_a: str, key_b: str, model: str | None = None, context: int | None = None,
                   budget: int = DEFAULT_BUDGET, time_limit_s: float = DEFAULT_TIME_LIMIT_S, rounds: int = DEFAULT_ROUNDS,
                   seed: int | None = None, on_result: Callable[[CheckResult], None] | None = None) -> ProbeReport:
    """Run every check against `url`; CannotProbe if the endpoint cannot be probed at all."""
    client = ProbeClient(url, budget, time_limit_s)
    try:
        session = open_session(client, key_a, key_b, model, context, seed)
        report = ProbeReport(client.base, client.model, session.context, [mask(key_a), mask(key_b)])
        for name, check in checks(rounds):
            result = CheckResult(name)
            report.results.append(result)
            try:
                check(session, result)
            except OutOfBudget as e:
                result.decide(INCOMPLETE, str(e))
            if on_result:
                on_result(result)
    except OutOfBudget as e:
        raise CannotProbe(str(e)) from None
    finally:
        client.close()
    report.requests_sent = client.sent
    return report


def run_probe(args: argparse.Namespace) -> int:
    """The command: print each check as it finishes (or one JSON object); the exit status."""
    if len(args.key) != 2 or args.key[0] == args.key[1]:
        print("error: give two different keys you own: --key KEY_A --key KEY_B", file=sys.stderr)
        return 2
    if not args.time_limit > 0:
        print(f"error: --time-limit must be above 0, got {args.time_limit}", file=sys.stderr)
        return 2
    show = None if args.json else (lambda r: print(r.format(), flush=True))
    try:
        report = probe_endpoint(args.url, *args.key, model=args.model, context=args.context, budget=args.budget,
                                time_limit_s=args.time_limit, rounds=args.rounds, seed=args.seed, on_result=show)
    except CannotProbe as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=2) if args.json else report.summary())
    return report.status
