"""`minikv serve`'s flags: declared (for `serve`, and the switch and model flags for every command that
loads the model) and checked before the slow model load. Light: no torch until a check needs it."""

import argparse

SHUTDOWN_GRACE_S = 10.0  # what requests in flight get to finish after SIGTERM, by default
SAFE_PREFILL_CHUNK = 128  # the safe preset's prefill chunk: measured in docs/serve.md ("Fairness")


def positive_int(text: str, zero: bool = False) -> int:
    """An argparse type: a whole number above zero (or 0 and more, with `zero`)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0 or value == 0 and not zero:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}" if zero else
                                         f"must be a positive whole number, got {value}")
    return value


def prefill_chunk(text: str) -> int:
    """An argparse type: a chunk of tokens, or "off" (0: whole prompts)."""
    return 0 if text == "off" else positive_int(text)


def add_switch_arguments(parser: argparse.ArgumentParser, preset_help: str) -> None:
    """--preset, --enable and --disable: the safety switches, as `serve` and `demo` take them."""
    parser.add_argument("--preset", choices=["vulnerable", "safe"], help=preset_help)
    for flag, what in (("--enable", "on"), ("--disable", "off")):
        parser.add_argument(flag, action="append", default=[], metavar="SWITCH",
                            help=f"turn a safety switch {what} (repeatable)")


def add_model_arguments(parser: argparse.ArgumentParser, hidden: bool = False) -> None:
    """--model and --device, as every command that loads the model takes them (demo hides --model)."""
    parser.add_argument("--model", help=argparse.SUPPRESS if hidden else "local Llama checkpoint directory "
                        "(default: data/tiny-llama)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if present)")


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to listen on (default %(default)s: this machine only)")
    add("--port", type=int, default=8000, help="port (default %(default)s)")
    add("--disagg", action="store_true", help="serve through the disaggregated prefill/decode cluster")
    add("--transport", default="inprocess", choices=["inprocess", "distributed"], help="with --disagg: both "
        "nodes in this process (default), or each in its own worker process with the KV moved by "
        "torch.distributed")
    add_switch_arguments(parser, "safety switches (default safe)")
    add("--api-key", action="append", default=[], metavar="TENANT=KEY",
        help="a bearer key and the tenant it stands for (repeatable); none: everyone is tenant 'anon'")
    add("--shutdown-grace", type=float, default=SHUTDOWN_GRACE_S, metavar="S", help="after SIGTERM, how "
        "long requests in flight may go on before a 503 ends them (default %(default)g)")
    add("--admin-key", metavar="KEY", help="the operator's bearer key: /health shows it pools, requests and "
        "workers (anyone else sees liveness only)")
    add("--log", metavar="FILE", help="append the gateway log (JSON Lines, the scan-logs schema) to FILE")
    add_model_arguments(parser)
    add("--context-len", type=positive_int, help="context window in tokens (default 1024)")
    add("--num-pages", type=positive_int, default=256,
        help="KV pool pages of the single engine (default %(default)s)")
    add("--max-batch", type=positive_int, metavar="N", help="requests the single engine runs at once "
        "(default: the pool's tokens / 64, a typical prompt: 64 for 256 pages)")
    add("--prefill-chunk", type=prefill_chunk, metavar="TOKENS|off",
        help=f"chunked prefill: a prompt at most this many tokens a step, a decode step between (default: "
        f"{SAFE_PREFILL_CHUNK} with --preset safe, off with vulnerable)")
    add("--max-body-bytes", type=positive_int, help="largest request body accepted (default 1 MiB)")
    add("--threads", type=positive_int, default=1, help="torch intra-op threads (default %(default)s)")
    add("--mystery", type=lambda text: positive_int(text, zero=True), metavar="SEED", help="the "
        "prefill/decode pair with safety switches drawn from SEED and shown nowhere, for an audit from the "
        "outside (notebook 13; two --api-key or more)")


def check_args(args: argparse.Namespace):
    """Keys and switches, checked before the slow model load: ({key: tenant}, SafetySwitches)."""
    from minikv.disagg.switches import SafetySwitches
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be 0-65535, got {args.port}")
    pair = args.disagg or args.mystery is not None
    if args.max_batch is not None and (pair or args.max_batch > args.num_pages):
        n = args.num_pages
        why = "the pair has no batch limit" if pair else f"{n} pages run at most {n} requests; give 1 to {n}"
        raise ValueError(f"--max-batch {args.max_batch}: {why}")
    if args.transport != "inprocess" and not args.disagg:
        raise ValueError(f"--transport {args.transport} needs --disagg (the single engine has no transfer)")
    if not 0 <= args.shutdown_grace <= 3600:
        raise ValueError(f"--shutdown-grace must be 0 to 3600 seconds, got {args.shutdown_grace:g}")
    if args.admin_key and args.admin_key in {spec.partition("=")[2] for spec in args.api_key}:
        raise ValueError("--admin-key must not be a tenant's key: a tenant would see every other tenant's "
                         "activity")
    keys: dict[str, str] = {}
    for tenant, sep, key in (spec.partition("=") for spec in args.api_key):
        if not sep or not tenant or not key:
            raise ValueError(f"--api-key wants TENANT=KEY, got {tenant!r}=...")
        if key in keys:
            raise ValueError(f"the same key is given to tenants {keys[key]!r} and {tenant!r}")
        keys[key] = tenant
    if args.mystery is not None:
        from minikv.serve.mystery import check_mystery_args, draw
        check_mystery_args(args, len(set(keys.values())))
        return keys, draw(args.mystery)
    return keys, SafetySwitches.preset(args.preset or "safe").with_switches(args.enable, args.disable)


def chunk_of(args: argparse.Namespace) -> int | None:
    """The prefill chunk in tokens, or None for whole prompts: as given, else the preset's."""
    if args.prefill_chunk is None:
        return SAFE_PREFILL_CHUNK if args.preset != "vulnerable" else None
    return args.prefill_chunk or None
