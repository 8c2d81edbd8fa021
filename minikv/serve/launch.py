"""Start `minikv serve` on a free loopback port and stop it cleanly: as a child process, or on a thread.

`ServerProcess` runs `python -m minikv serve ARGS` exactly as a terminal would (the tests and the
load script use it). `ServerThread` runs the same uvicorn server on a thread of this process over a
model already loaded, so a notebook pays for torch and the model once (notebook 10 uses it).

    with ServerProcess(["--disagg", "--preset", "vulnerable", "--api-key", "alice=sk-alice"]) as server:
        openai.OpenAI(base_url=server.base_url, api_key="sk-alice") ...
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

READY_TIMEOUT_S = 120.0  # loading the model on a busy 2-core machine can take a while
STOP_TIMEOUT_S = 20.0


def free_port() -> int:
    """A TCP port nothing on 127.0.0.1 listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def operator_health(url: str, admin_key: str) -> dict:
    """/health as the operator sees it: pools, live requests, steps, workers."""
    return httpx.get(url + "/health", headers={"Authorization": f"Bearer {admin_key}"}, timeout=5.0).json()


class ServerStartError(RuntimeError):
    """The server exited, or never answered /health; the message holds its output."""


class ServerProcess:
    """A `minikv serve` child process; a context manager that stops it with SIGTERM."""

    def __init__(self, args: list[str], port: int | None = None, env: dict[str, str] | None = None) -> None:
        """Start the server and return once it answers /health."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"
        self._output = tempfile.TemporaryFile(mode="w+")
        self.admin_key = secrets.token_hex(12)  # the operator's key of this server (its /health details)
        root = str(Path(__file__).resolve().parents[2])
        child_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, child_env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "minikv", "serve", "--port", str(self.port), *args, "--admin-key", self.admin_key],
            stdout=self._output, stderr=subprocess.STDOUT, env=child_env,
        )
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(f"the server exited with status {self.process.returncode}: {self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ServerStartError(f"no answer on {self.url}/health after {READY_TIMEOUT_S:.0f} s: {self.output()}")

    def health(self) -> dict:
        return operator_health(self.url, self.admin_key)

    def output(self) -> str:
        """Everything the server printed so far (its startup log; never a prompt)."""
        self._output.flush()
        self._output.seek(0)
        return self._output.read()

    def stop(self) -> int:
        """SIGTERM, as a terminal's Ctrl-C or a process manager would; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerThread:
    """`minikv serve ARGS` on a thread of this process, over an already loaded model and tokenizer."""

    def __init__(self, args: list[str], model, tokenizer, port: int | None = None) -> None:
        from minikv.cli import positive_int
        from minikv.serve.command import add_serve_arguments, build_server

        parser = argparse.ArgumentParser(prog="minikv serve")
        add_serve_arguments(parser, positive_int)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"
        self.admin_key = secrets.token_hex(12)
        argv = ["--port", str(self.port), *args, "--admin-key", self.admin_key]
        self.server, self.startup_log = build_server(parser.parse_args(argv), model, tokenizer)
        self.thread = threading.Thread(target=self.server.run, name=f"minikv-serve-{self.port}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise ServerStartError(f"the server on {self.url} did not start")
            time.sleep(0.05)

    def health(self) -> dict:
        return operator_health(self.url, self.admin_key)

    def stop(self) -> int:
        """What SIGTERM does to the process, without the grace: stop accepting, end the loop."""
        self.server.engine_loop.drain(0.0)
        self.server.should_exit = True
        self.thread.join(STOP_TIMEOUT_S)
        return 0 if not self.thread.is_alive() else 1

    def __enter__(self) -> "ServerThread":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
