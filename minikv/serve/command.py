"""`python -m minikv serve`: load the model, build one engine (or the prefill/decode cluster), serve; on
SIGINT or SIGTERM drain for --shutdown-grace seconds, 503 what is still running, exit 0 (docs/serve.md)."""

import argparse
import asyncio
import signal
import sys

from minikv.serve.flags import check_args


def build_server(args: argparse.Namespace, tokenizer, model=None):
    """The uvicorn server for `args` (its `engine_loop` attached) and its startup lines: its engine core in a
    process of its own that loads the model, or on a thread over `model` when one is given (ServerThread).
    ValueError with one line when it must not start (startup_check, an unwritable log, ...)."""
    import uvicorn

    from minikv.engine.front_door import UNTOKENIZED_FACTOR
    from minikv.serve.app import DEFAULT_MAX_BODY_BYTES, ServerSettings, create_app
    from minikv.serve.connections import (KEEP_ALIVE_S, Warner, connection_cap, guarded_protocol,
                                          quiet_accept_errors)
    from minikv.serve.backend import model_name, start_door, startup_lines
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
