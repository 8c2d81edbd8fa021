"""`python -m minikv peer setup|serve vllm`: a real engine beside minikv, in a venv of its own.

    install.py   `peer setup`: the venv under ~/.cache/minikv/peers, the incompatible packages removed
    server.py    `peer serve` and `PeerServer`: vLLM on loopback with minikv's window and pool size

docs/peers.md says what is installed, how big it is and how long it takes.
"""

from __future__ import annotations

import argparse
import signal
import sys

from minikv.peer.install import PEERS, PeerError, peers_dir, setup_peer


def add_peer_parser(sub) -> None:
    """Register `peer setup NAME` and `peer serve NAME [--port P] [--model DIR]` on the subcommands."""
    p = sub.add_parser("peer", help="a real engine (vLLM's CPU build) beside minikv, in its own venv")
    actions = p.add_subparsers(dest="action", required=True)
    setup = actions.add_parser("setup", help=f"make the peer's venv under {peers_dir()} ($MINIKV_PEERS_DIR to change)")
    setup.add_argument("name", choices=sorted(PEERS))
    serve = actions.add_parser("serve", help="start the peer on 127.0.0.1 with minikv serve's window and pool size")
    serve.add_argument("name", choices=sorted(PEERS))
    serve.add_argument("--port", type=int, help="port (default: a free one)")
    serve.add_argument("--model", help="local Llama checkpoint directory (default: data/tiny-llama)")
    p.set_defaults(func=run_peer)


def run_peer(args: argparse.Namespace) -> int:
    """The command; a PeerError is one line on stderr and exit status 2."""
    try:
        if args.action == "setup":
            print(setup_peer(args.name, say=lambda line: print(line, flush=True)))
            return 0
        return serve_until_stopped(args)
    except PeerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # during setup: the venv is left unfinished, and the next run finishes it
        print("error: interrupted; run the command again to finish", file=sys.stderr)
        return 130


def serve_until_stopped(args: argparse.Namespace) -> int:
    """Start the peer, print its URL, and stop it (all of it) on Ctrl-C or SIGTERM."""
    from minikv.peer.server import PeerServer

    if args.port is not None and not 1 <= args.port <= 65535:
        raise PeerError(f"--port must be 1-65535, got {args.port}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as Ctrl-C does
    print(f"starting {args.name} (a few minutes on 2 cores) ...", flush=True)
    try:
        with PeerServer(args.name, port=args.port, model_dir=args.model) as server:
            print(f"{args.name} serves {server.model} on {server.base_url} (its log: {server.log}); Ctrl-C stops it",
                  flush=True)
            server.process.wait()
    except KeyboardInterrupt:
        print(f"{args.name} stopped", flush=True)
        return 0
    print(f"error: {args.name} exited with status {server.process.returncode}: {server.last_line()}", file=sys.stderr)
    return 2
