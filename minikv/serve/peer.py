"""`python -m minikv peer setup|serve vllm`: a real engine beside minikv, set up as `minikv serve` is by default.

`peer setup` makes its venv (peer_venv.py); `peer serve` starts it on 127.0.0.1 (PeerServer):

The same model (served under the same name), the same context window (1,024 tokens) and a pool
of the same size (256 pages of 16 tokens in minikv = 128 blocks of 32 in vLLM, whose CPU kernels
want blocks of a multiple of 32), prefix caching on and `usage.prompt_tokens_details.cached_tokens`
reported, greedy float32 on the CPU:

    with PeerServer() as vllm:                    # a few minutes on 2 cores: the import, a warm-up
        openai.OpenAI(base_url=vllm.base_url, api_key="any") ...

vLLM starts an engine-core child process; the peer runs in a session of its own, so stopping it
(SIGTERM, then SIGKILL to the whole session if it lingers) leaves no process behind.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from minikv.serve.peer_venv import PEERS, PeerError, installed, peers_dir, setup_peer, venv_dir
from minikv.model.checkpoint import default_model_dir
from minikv.serve.launch import ServerProcess, free_port

READY_TIMEOUT_S = 900.0  # measured: about 2.5 minutes on 2 quiet cores; far longer under load
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
    """vLLM as a child process in its own session: a ServerProcess whose command is vLLM's, stopped whole."""

    def __init__(self, name: str = "vllm", port: int | None = None, model_dir: str | Path | None = None,
                 num_pages: int = NUM_PAGES, context_len: int = CONTEXT_LEN, log: Path | None = None) -> None:
        """Start the peer and return once it answers /v1/models; PeerError if it cannot."""
        if not installed(name):
            raise PeerError(f"{name} is not set up in {venv_dir(name)}: run `python -m minikv peer setup {name}` first")
        model = Path(model_dir or default_model_dir()).resolve()
        if not (model / "config.json").is_file():
            raise PeerError(f"--model {model}: no config.json there (give a local Llama checkpoint directory)")
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url, self.model = self.url + "/v1", model.name
        self.log = log or venv_dir(name) / f"serve-{self.port}.log"
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
        with self.log.open("w") as out:
            self.process = subprocess.Popen(vllm_command(venv_dir(name) / "bin" / "python", model, self.port,
                                                         num_pages, context_len),
                                            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            self.wait_ready()
        except BaseException:  # Ctrl-C while it starts, too: nothing is left behind
            self.stop()
            raise

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PeerError(f"vLLM exited with status {self.process.returncode} while starting: "
                                f"{self.last_line()} (its log: {self.log})")
            try:
                if httpx.get(self.base_url + "/models", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise PeerError(f"vLLM did not answer on {self.url} within {READY_TIMEOUT_S:.0f} s (its log: {self.log})")

    def last_line(self) -> str:
        lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line]
        return (errors or lines or ["(no output)"])[-1].strip()[:300]

    def stop(self) -> int:
        """SIGTERM to vLLM, which stops its engine core; then SIGKILL to whatever of its session is left."""
        status = super().stop()
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the session's group: the engine core, if it outlived its parent
        except ProcessLookupError:
            pass
        return status


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
