"""`python -m minikv serve`: load the model, build one engine (or the prefill/decode cluster), serve; on
SIGINT or SIGTERM drain for --shutdown-grace seconds, 503 what is still running, exit 0 (docs/serve.md)."""

import argparse
import asyncio
import signal
import sys
from pathlib import Path

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


def start_door(args: argparse.Namespace, keys: dict[str, str], switches, model, tokenizer):
    """The front door `args` ask for (under --mystery the seed's pair); ValueError with one line when it must
    not start (startup_check, a worker that did not start)."""
    from minikv.disagg.cluster import StartupRefused
    from minikv.disagg.dist.cluster import WorkerStartError
    from minikv.serve.backend import build_backend
    from minikv.serve.mystery import MYSTERY_CONTEXT_LEN, prefill_pages
    mystery = args.mystery is not None
    try:
        return build_backend(model, tokenizer, switches, args.disagg or mystery,
                             MYSTERY_CONTEXT_LEN if mystery else args.context_len, args.num_pages,
                             args.transport, args.model, args.device, args.threads,
                             tenants=len(set(keys.values())), prefill_chunk=chunk_of(args),
                             prefill_pages=prefill_pages(switches) if mystery else None,
                             max_batch=args.max_batch)
    except StartupRefused as e:
        raise ValueError(f"startup_check refused to start: {e}") from None
    except WorkerStartError as e:
        raise ValueError(f"the distributed cluster did not start: {e}") from None


def startup_lines(args: argparse.Namespace, backend, switches, keys: dict[str, str]) -> list[str]:
    """What the server prints before it serves: each pool, the topology and switches, the tenants. Under
    --mystery only the address, the window and the tenants: the rest would give the switches away."""
    where = f"on http://{args.host}:{args.port}; context window {backend.config.context_len} tokens"
    names = ", ".join(sorted(set(keys.values()))) or "none (no keys: every caller is tenant anon)"
    tenants = f"tenants: {names}; gateway log: {args.log or 'off'}"
    if args.mystery is not None:
        hidden = f"mystery seed {args.mystery}: what it runs is not shown"
        return [f"serving {model_name(args)} ({hidden}) {where}", tenants]
    topology = "prefill/decode cluster" if args.disagg else "one engine"
    if args.transport == "distributed":
        topology += ", two worker processes, KV over torch.distributed"
    chunk = chunk_of(args)
    topology += f"; prefill in chunks of {chunk} tokens" if chunk else "; whole-prompt prefill"
    on = ", ".join(n for n, v in switches.as_dict().items() if v) or "none (vulnerable)"
    switches_on = f"; switches on: {on}" if args.disagg else ""
    return backend.startup_log() + [f"serving {model_name(args)} ({topology}) {where}{switches_on}", tenants]


def model_name(args: argparse.Namespace) -> str:
    from minikv.model.checkpoint import default_model_dir
    return Path(args.model).name if args.model else default_model_dir().name


def build_server(args: argparse.Namespace, tokenizer, model=None):
    """The uvicorn server for `args` (its `engine_loop` attached) and its startup lines: its engine core in a
    process of its own that loads the model, or on a thread over `model` when one is given (ServerThread).
    ValueError with one line when it must not start (startup_check, an unwritable log, ...)."""
    import uvicorn

    from minikv.engine.front_door import UNTOKENIZED_FACTOR
    from minikv.serve.app import DEFAULT_MAX_BODY_BYTES, ServerSettings, create_app
    from minikv.serve.connections import (KEEP_ALIVE_S, Warner, connection_cap, guarded_protocol,
                                          quiet_accept_errors)
    from minikv.serve.engine_loop import CoreProcess, CoreThread, EngineLoop
    from minikv.serve.gateway import GatewayLog
    keys, switches = check_args(args)
    try:
        gateway = GatewayLog(args.log)
    except OSError as e:
        raise ValueError(f"cannot open the gateway log {args.log}: {e.strerror or e}") from None
    if model is None:
        core = CoreProcess(args)
        lines, context_len = core.ready.startup_lines, core.ready.context_len
    else:
        backend = start_door(args, keys, switches, model, tokenizer)
        core, context_len = CoreThread(backend), backend.config.context_len
        lines = startup_lines(args, backend, switches, keys)
    loop = EngineLoop(core, tokenizer)
    mystery = args.mystery is not None  # then no operator's view of /health and no engine reasons: both tell
    settings = ServerSettings(model_name(args), context_len, keys,
                              max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
                              admin_key=None if mystery else args.admin_key, engine_reasons=not mystery,
                              max_prompt_chars=UNTOKENIZED_FACTOR * context_len * loop.chars_per_token)
    warner = Warner()
    config = uvicorn.Config(create_app(loop, settings, gateway), host=args.host, port=args.port,
                            log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=args.shutdown_grace + 5,
                            timeout_keep_alive=KEEP_ALIVE_S, http=guarded_protocol(connection_cap(), warner))

    class DrainingServer(uvicorn.Server):  # uvicorn alone would cut the streams still open after its grace
        async def startup(self, sockets=None) -> None:
            quiet_accept_errors(asyncio.get_running_loop(), warner)
            await super().startup(sockets)

        def handle_exit(self, sig, frame) -> None:
            loop.drain(args.shutdown_grace)
            super().handle_exit(sig, frame)

    server = DrainingServer(config)
    server.engine_loop = loop
    return server, lines


def run_serve(args: argparse.Namespace) -> int:
    """Start the server and block until it is stopped; 2 with a one-line error if it cannot start. This
    process holds the tokenizer only: the engine core, in a process of its own, loads the model."""
    from minikv.model.checkpoint import load_tokenizer_of
    from minikv.serve.connections import raise_descriptor_limit
    check_args(args)
    raise_descriptor_limit()  # before the connection cap is read from it
    server, lines = build_server(args, load_tokenizer_of(args.model))
    print("\n".join(lines), flush=True)
    for sig in (signal.SIGINT, signal.SIGTERM):  # uvicorn takes these while it serves and, after its graceful
        signal.signal(sig, lambda *_: None)      # shutdown, raises them again: land here and exit 0
    try:
        server.run()
    except SystemExit:  # uvicorn exits when it cannot bind the port, after logging why
        print(f"error: could not serve on {args.host}:{args.port}", file=sys.stderr)
        return 2
    finally:
        server.engine_loop.stop()  # a second time is harmless; without the lifespan, the core's only stop
    print("server stopped", flush=True)
    return 0
