"""`python -m minikv peer setup|serve vllm`: a real engine beside minikv. `peer setup` makes its venv
(peer_venv.py); `peer serve` and `PeerServer` start it on 127.0.0.1 with `minikv serve`'s model, window and
pool size, prefix caching on and `cached_tokens` reported, greedy float32 on the CPU (docs/peers.md)."""

import argparse
import os
import signal
import sys
from pathlib import Path

from minikv.model.checkpoint import default_model_dir
from minikv.serve.guard import guarded
from minikv.serve.launch import LocalServer, ServerProcess
from minikv.serve.peer_venv import PEERS, PeerError, installed, peers_dir, setup_peer, venv_dir

READY_TIMEOUT_S = 900.0  # measured: about 95 s on 2 cores (docs/peers.md); far longer under load
PAGE_SIZE, NUM_PAGES, CONTEXT_LEN = 16, 256, 1024  # minikv serve's defaults
VLLM_BLOCK = 32  # the smallest block vLLM's CPU attention takes


def vllm_command(python: Path, model_dir: Path, port: int, num_pages: int = NUM_PAGES,
                 context_len: int = CONTEXT_LEN) -> list[str]:
    """vLLM's OpenAI server with minikv's pool (num_pages x 16 tokens) and context window."""
    blocks, rest = divmod(num_pages * PAGE_SIZE, VLLM_BLOCK)
    assert rest == 0, f"a pool of {num_pages} pages of {PAGE_SIZE} is not whole {VLLM_BLOCK}-token blocks"
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", model_dir.name, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "float32", "--max-model-len", str(context_len), "--enable-prefix-caching",
            "--enable-prompt-tokens-details", "--block-size", str(VLLM_BLOCK),
            "--num-gpu-blocks-override", str(blocks)]


class PeerServer(ServerProcess):
    """vLLM as a child process in its own session, ready once it answers /v1/models; stopped whole."""

    ready_path, ready_timeout_s, start_error = "/v1/models", READY_TIMEOUT_S, PeerError

    def __init__(self, name: str = "vllm", port: int | None = None, model_dir: str | Path | None = None,
                 num_pages: int = NUM_PAGES, context_len: int = CONTEXT_LEN) -> None:
        """Start the peer and return once it answers; PeerError if it cannot."""
        if not installed(name):
            raise PeerError(f"{name} is not set up in {venv_dir(name)}: run `python -m minikv peer setup "
                            f"{name}` first")
        model = Path(model_dir or default_model_dir()).resolve()
        if not (model / "config.json").is_file():
            raise PeerError(f"--model {model}: no config.json there (give a local Llama checkpoint "
                            "directory)")
        LocalServer.__init__(self, port)  # not ServerProcess's: the command is vLLM's
        self.name, self.model = name, model.name
        self.log = venv_dir(name) / f"serve-{self.port}.log"
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
        command = vllm_command(venv_dir(name) / "bin" / "python", model, self.port, num_pages, context_len)
        self.start(guarded(command), env, self.log.open("w+"), new_session=True)  # vLLM dies with us

    def last_words(self) -> str:
        """The last line that names an error (else the last line), and where the whole log is."""
        lines = [line for line in self.output().splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line]
        return f"{(errors or lines or ['(no output)'])[-1].strip()[:300]} (its log: {self.log})"


def add_peer_parser(sub) -> None:
    """Register `peer setup NAME` and `peer serve NAME [--port P] [--model DIR]` on the subcommands."""
    p = sub.add_parser("peer", help="a real engine (vLLM's CPU build) beside minikv, in its own venv")
    actions = p.add_subparsers(dest="action", required=True)
    setup = actions.add_parser("setup", help=f"make the peer's venv under {peers_dir()} "
                               "($MINIKV_PEERS_DIR to change)")
    setup.add_argument("name", choices=PEERS)
    serve = actions.add_parser("serve", help="start the peer on 127.0.0.1 with minikv serve's window and "
                               "pool size")
    serve.add_argument("name", choices=PEERS)
    serve.add_argument("--port", type=int, help="port (default: a free one)")
    serve.add_argument("--model", help="local Llama checkpoint directory (default: data/tiny-llama)")
    p.set_defaults(func=run_peer)


def run_peer(args: argparse.Namespace) -> int:
    """Set the peer up, or serve it until Ctrl-C or SIGTERM stops it (all of it); a PeerError: exit 2."""
    try:
        if args.action == "setup":
            print(setup_peer(args.name, say=lambda line: print(line, flush=True)))
            return 0
        if args.port is not None and not 1 <= args.port <= 65535:
            raise PeerError(f"--port must be 1-65535, got {args.port}")
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as Ctrl-C does
        print(f"starting {args.name} (about 95 s on 2 cores, longer when they are busy) ...", flush=True)
        with PeerServer(args.name, port=args.port, model_dir=args.model) as server:
            print(f"{args.name} serves {server.model} on {server.base_url} (its log: {server.log}); "
                  "Ctrl-C stops it", flush=True)
            server.process.wait()
        raise PeerError(f"{args.name} exited with status {server.process.returncode}: {server.last_words()}")
    except PeerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.action == "serve":
            print(f"{args.name} stopped", flush=True)
            return 0
        print("error: interrupted; run the command again to finish", file=sys.stderr)  # an unfinished venv
        return 130
