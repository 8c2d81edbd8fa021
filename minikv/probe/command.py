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

from minikv.probe.canary import check_canary
from minikv.probe.client import CannotProbe, OutOfBudget, ProbeClient, mask
from minikv.probe.honesty import check_honesty
from minikv.probe.over_length import check_over_length
from minikv.probe.prefix_cache import check_prefix_cache
from minikv.probe.report import INCOMPLETE, CheckResult, exit_status
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


def open_session(args: argparse.Namespace, client: ProbeClient) -> ProbeSession:
    """Both keys accepted, the model and its window known, the token scale measured."""
    key_a, key_b = args.key
    listed = client.models(key_a)
    client.models(key_b)
    card = next((m for m in listed if m.get("id") == args.model), None) if args.model else (listed[0] if listed else None)
    if card is None and not args.model:
        raise CannotProbe("/v1/models lists no model; pass --model")
    client.model = args.model or card["id"]
    context = args.context or (card or {}).get("max_model_len") or (card or {}).get("context_length")
    if not isinstance(context, int) or context < 64:
        raise CannotProbe("the endpoint does not advertise its context window (max_model_len); pass --context N")
    rng = random.Random(args.seed)
    return ProbeSession(client, key_a, key_b, context, calibrate(client, key_a, rng), rng)


def run_probe(args: argparse.Namespace) -> int:
    if len(args.key) != 2 or args.key[0] == args.key[1]:
        print("error: give two different keys you own: --key KEY_A --key KEY_B", file=sys.stderr)
        return 2
    if not args.time_limit > 0:
        print(f"error: --time-limit must be above 0, got {args.time_limit}", file=sys.stderr)
        return 2
    client = ProbeClient(args.url, args.budget, args.time_limit)
    results: list[CheckResult] = []
    try:
        session = open_session(args, client)
        for name, check in checks(args.rounds):
            result = CheckResult(name)
            results.append(result)
            try:
                check(session, result)
            except OutOfBudget as e:
                result.decide(INCOMPLETE, str(e))
            if not args.json:
                print(result.format(), flush=True)
    except (CannotProbe, OutOfBudget) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        client.close()
    status = exit_status(results)
    if args.json:
        print(json.dumps({"endpoint": client.base, "model": client.model, "context": session.context,
                          "keys": [mask(k) for k in args.key], "requests_sent": client.sent,
                          "checks": [r.to_json() for r in results], "exit_status": status}, indent=2))
    else:
        failed = [r.name for r in results if r.verdict != "pass"]
        print(f"{client.sent} requests to {client.base} ({client.model}, window {session.context:,} tokens): "
              + ("all checks passed" if not failed else f"not passed: {', '.join(failed)}"))
    return status
