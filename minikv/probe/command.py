"""`python -m minikv probe URL --key KEY_A --key KEY_B [...]`: the command line (docs/serve.md, "The probe").
Exit status: 0 every check passed, 1 a check failed, 2 the endpoint could not be probed or a check not end."""

import argparse
import json
import math
import sys
from collections.abc import Callable

from minikv.probe.report import CHECKS, DEFAULT_CHECKS, ProbeOptions


def add_probe_arguments(parser: argparse.ArgumentParser, positive_int: Callable[[str], int]) -> None:
    add = parser.add_argument
    add("url", metavar="URL", help="the endpoint, e.g. http://127.0.0.1:8000 (or .../v1)")
    add("--key", action="append", default=[], metavar="KEY", help="an API key you own; give exactly two (A, then B)")
    add("--model", help="model id (default: the first one /v1/models lists)")
    add("--context", type=positive_int,
        help="the advertised context window in tokens (default: max_model_len from /v1/models)")
    add("--check", action="append", choices=CHECKS, metavar="NAME",
        help=f"a check to run (repeatable; one of {', '.join(CHECKS)}; default: {', '.join(DEFAULT_CHECKS)})")
    add("--salt-per-key", action="store_true", help="send each key's requests with a cache_salt of its own "
        "(a hash of the key), as a gateway that salts per tenant does")
    add("--budget", type=positive_int, default=ProbeOptions.budget, help="most requests to send (default %(default)s)")
    add("--time-limit", type=float, default=ProbeOptions.time_limit_s, metavar="SECONDS",
        help="stop after this long (default %(default)s)")
    add("--rounds", type=positive_int, default=ProbeOptions.rounds,
        help="rounds of the prefix-cache audit, 4 requests each (default %(default)s)")
    add("--seed", type=int, help="seed for the random prompts and canaries (default: fresh each run)")
    add("--json", action="store_true", help="print one JSON object instead of the text report")


def run_probe(args: argparse.Namespace) -> int:
    """The command: print each check as it finishes (or one JSON object); the exit status."""
    if len(args.key) != 2 or args.key[0] == args.key[1]:
        print("error: give two different keys you own: --key KEY_A --key KEY_B", file=sys.stderr)
        return 2
    if not (math.isfinite(args.time_limit) and args.time_limit > 0):
        print(f"error: --time-limit must be a number of seconds above 0, got {args.time_limit}", file=sys.stderr)
        return 2
    from minikv.probe.run import CannotProbe, probe_endpoint  # scipy and httpx: only when the probe runs
    show = None if args.json else (lambda r: print(r.format(), flush=True))
    try:
        report = probe_endpoint(args.url, *args.key, on_result=show, model=args.model, context=args.context,
                                budget=args.budget, time_limit_s=args.time_limit, rounds=args.rounds, seed=args.seed,
                                salt_per_key=args.salt_per_key, checks=tuple(args.check or DEFAULT_CHECKS))
    except CannotProbe as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a reply no test foresaw: still one line and "could not probe", never a FAIL
        print(f"error: internal error of the probe ({type(e).__name__}: {e}); please report it", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=2) if args.json else report.summary())
    return report.status
