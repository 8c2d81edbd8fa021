"""`minikv probe` against a server no one here wrote: `transformers serve` on the shipped model.

Its streams end after a final chunk (finish_reason and usage) without `data: [DONE]`, its usage has no
`cached_tokens`, and `/v1/models` gives no window (hence `--context 2048`, the model's positions). It answers a
prompt past those positions with 200: the probe fails its over-length check, exit 1. `transformers serve` needs
the `serving` extra's `accelerate` (requirements-dev.txt); without it the test is skipped on a laptop and fails
under CI=true. It never downloads (HF_HUB_OFFLINE).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from minikv.probe.report import FAIL
from minikv.serve.launch import LocalServer, ServerProcess

MODEL = Path(__file__).resolve().parents[1] / "data" / "tiny-llama"
POSITIONS = json.loads((MODEL / "config.json").read_text())["max_position_embeddings"]


class TransformersServe(ServerProcess):
    """`transformers serve MODEL` on a free loopback port, on the CPU, offline."""

    name, ready_path, ready_timeout_s = "transformers serve", "/v1/models", 300.0

    def __init__(self) -> None:
        LocalServer.__init__(self, None)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        command = [shutil.which("transformers") or "transformers", "serve", str(MODEL), "--host", "127.0.0.1",
                   "--port", str(self.port), "--device", "cpu"]
        self.start(command, env, tempfile.TemporaryFile(mode="w+"))


@pytest.fixture(scope="module")
def transformers_serve():
    try:
        import accelerate  # noqa: F401  (requirements-dev.txt installs it)
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("`transformers serve` needs accelerate (requirements-dev.txt); CI must run this test")
        pytest.skip("`transformers serve` needs accelerate (pip install -r requirements-dev.txt)")
    with TransformersServe() as server:
        yield server


def test_probe_fails_transformers_serve_over_length_and_names_its_quirks(transformers_serve):
    r = subprocess.run([sys.executable, "-m", "minikv", "probe", transformers_serve.url, "--key", "sk-alice-0001",
                        "--key", "sk-bob-0002", "--context", str(POSITIONS), "--seed", "0", "--check", "over-length",
                        "--json"], capture_output=True, text=True, timeout=600)
    report = json.loads(r.stdout)
    assert r.returncode == 1, r.stderr
    assert [(c["name"], c["verdict"]) for c in report["checks"]] == [("over-length", FAIL)]
    assert "answered 200" in report["checks"][0]["reason"]
    quirks = " | ".join(report["quirks"])
    assert "[DONE]" in quirks and "cached_tokens" in quirks and "taken from /v1/models" in quirks, quirks
