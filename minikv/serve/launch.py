"""Start `python -m minikv serve` in a child process on a free loopback port, and stop it cleanly.

Notebook 10, the tests and the load script all use this, so a server is always started and
stopped the same way a person would start it in a terminal:

    with ServerProcess(["--disagg", "--preset", "vulnerable", "--api-key", "alice=sk-alice"]) as server:
        openai.OpenAI(base_url=server.base_url, api_key="sk-alice") ...
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
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


class ServerStartError(RuntimeError):
    """The server exited, or never answered /health; the message holds its output."""


class ServerProcess:
    """A `minikv serve` child process; a context manager that stops it with SIGTERM."""

    def __init__(self, args: list[str], port: int | None = None, env: dict[str, str] | None = None,
                 wait: bool = True) -> None:
        """Start the server; with `wait`, return once it answers /health (else call wait_ready)."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"
        self._output = tempfile.TemporaryFile(mode="w+")
        root = str(Path(__file__).resolve().parents[2])
        child_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, child_env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "minikv", "serve", "--port", str(self.port), *args],
            stdout=self._output, stderr=subprocess.STDOUT, env=child_env,
        )
        if wait:
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
        return httpx.get(self.url + "/health", timeout=5.0).json()

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
