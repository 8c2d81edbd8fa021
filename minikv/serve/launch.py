"""A server on a free loopback port, started and stopped cleanly: `ServerProcess` runs `python -m minikv serve
ARGS` as a terminal would; `ServerThread` runs it on a thread over a model already loaded (notebook 11);
`peer.PeerServer` is a ServerProcess running vLLM. Each is a context manager that stops it."""

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TextIO

import httpx

from minikv.disagg.dist.cluster import free_port

READY_TIMEOUT_S = 120.0  # loading the model on a busy 2-core machine can take a while
STOP_TIMEOUT_S = 20.0


class ServerStartError(RuntimeError):
    """The server exited, or never answered; the message holds what it printed."""


class LocalServer(AbstractContextManager):
    """A server on 127.0.0.1:`port` (a free one by default) with an operator's key."""

    name, ready_path, ready_timeout_s = "minikv serve", "/health", READY_TIMEOUT_S
    start_error: type[Exception] = ServerStartError

    def __init__(self, port: int | None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"
        self.admin_key = secrets.token_hex(12)  # the operator's key of this server (its /health details)

    def wait_ready(self, running: Callable[[], bool]) -> None:
        """Return once the server answers `ready_path`; if it ends or times out first, stop it and raise."""
        deadline = time.monotonic() + self.ready_timeout_s
        try:
            while running() and time.monotonic() < deadline:
                try:
                    if httpx.get(self.url + self.ready_path, timeout=2.0).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            how = "ended" if not running() else f"did not answer within {self.ready_timeout_s:.0f} s"
            raise self.start_error(f"{self.name} on {self.url} {how} while starting: {self.last_words()}")
        except BaseException:  # Ctrl-C while it starts, too: nothing is left behind
            self.stop()
            raise

    def health(self) -> dict:
        """/health as the operator sees it: pools, live requests, steps, workers."""
        operator = {"Authorization": f"Bearer {self.admin_key}"}
        return httpx.get(self.url + "/health", headers=operator, timeout=5.0).json()

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerProcess(LocalServer):
    """A `minikv serve ARGS` child process; `stop` sends SIGTERM."""

    def __init__(self, args: list[str], port: int | None = None, env: dict[str, str] | None = None) -> None:
        super().__init__(port)
        root = str(Path(__file__).resolve().parents[2])
        child_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, child_env.get("PYTHONPATH")) if p)
        command = [sys.executable, "-m", "minikv", "serve", "--port", str(self.port), *args,
                   "--admin-key", self.admin_key]
        self.start(command, child_env, tempfile.TemporaryFile(mode="w+"))

    def start(self, command: list[str], env: dict[str, str], output: TextIO,
              new_session: bool = False) -> None:
        """Run `command`, its output to `output` (in a session of its own if `new_session`); wait for it."""
        self._output, self.new_session = output, new_session
        self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=new_session)
        self.wait_ready(lambda: self.process.poll() is None)

    def output(self) -> str:
        """Everything the server printed so far (its startup log; never a prompt)."""
        self._output.flush()
        self._output.seek(0)
        return self._output.read()

    def last_words(self) -> str:
        """What a start error quotes: the exit status, if any, and the output."""
        status = self.process.poll()
        return (f"exit status {status}; " if status is not None else "") + self.output()

    def stop(self) -> int:
        """SIGTERM, as a process manager would (SIGKILL if it lingers); the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.new_session:  # then SIGKILL to whatever of its session is left (vLLM's engine core)
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return self.process.returncode


class ServerThread(LocalServer):
    """`minikv serve ARGS` on a thread of this process, over an already loaded model and tokenizer."""

    def __init__(self, args: list[str], model, tokenizer, port: int | None = None) -> None:
        from minikv.serve.command import build_server
        from minikv.serve.flags import add_serve_arguments
        super().__init__(port)
        parser = argparse.ArgumentParser(prog="minikv serve")
        add_serve_arguments(parser)
        argv = ["--port", str(self.port), *args, "--admin-key", self.admin_key]
        self.server, self.startup_log = build_server(parser.parse_args(argv), tokenizer, model)
        self.thread = threading.Thread(target=self.server.run, name=f"minikv-serve-{self.port}", daemon=True)
        self.thread.start()
        self.wait_ready(self.thread.is_alive)

    def last_words(self) -> str:
        return "its traceback, if any, is on stderr"

    def stop(self) -> int:
        """What SIGTERM does to the process, without the grace: stop accepting, end the loop."""
        self.server.engine_loop.drain(0.0)
        self.server.should_exit = True
        self.thread.join(STOP_TIMEOUT_S)
        return 0 if not self.thread.is_alive() else 1
