"""`minikv probe` against a server no one here wrote: `transformers serve` on the shipped model.

Its streams end after a final chunk (finish_reason and usage) without `data: [DONE]`, its usage has no
`cached_tokens`, and `/v1/models` gives no window (hence `--context 2048`, the model's positions). Whether it
answers a prompt past those positions depends on its release (5.24 answered 200; 5.25 answers 400 naming both
numbers): the test asks it directly, and the probe's over-length verdict must agree. `transformers serve` needs
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

import httpx
import pytest

from minikv.probe.report import FAIL, PASS
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


def status_past_the_positions(url: str) -> int:
    """What the server itself answers to a prompt 20 tokens past the model's positions (one token a character)."""
    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    body = {"model": model, "prompt": "a " * ((POSITIONS + 20) // 2), "max_tokens": 4}
    return httpx.post(url + "/v1/completions", json=body, timeout=300).status_code


def test_probe_judges_transformers_serve_past_its_window_as_it_behaves_and_names_its_quirks(transformers_serve):
    """Over-length FAILs (exit 1) where the server answers 200 past its positions and PASSes (exit 0) where it
    refuses; either way the three quirks are named."""
    answered = status_past_the_positions(transformers_serve.url) == 200
    r = subprocess.run([sys.executable, "-m", "minikv", "probe", transformers_serve.url, "--key", "sk-alice-0001",
                        "--key", "sk-bob-0002", "--context", str(POSITIONS), "--seed", "0", "--check", "over-length",
                        "--json"], capture_output=True, text=True, timeout=600)
    report = json.loads(r.stdout)
    assert r.returncode == (1 if answered else 0), r.stderr
    assert [(c["name"], c["verdict"]) for c in report["checks"]] == [("over-length", FAIL if answered else PASS)]
    assert ("answered 200" in report["checks"][0]["reason"]) == answered, report["checks"][0]["reason"]
    quirks = " | ".join(report["quirks"])
    assert "[DONE]" in quirks and "cached_tokens" in quirks and "taken from /v1/models" in quirks, quirks
