"""The real engine beside ours: vLLM's CPU build, started once for the module (docs/peers.md).

Skipped when the peer's venv is absent (`python -m minikv peer setup vllm` makes it), except under
`CI=true`, where `.ci/run` sets it up first and a missing peer is a failure. The setup's errors are
checked without the peer: they must be one line and exit status 2.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import string
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from minikv.bench.benchmark import bench_workload
from minikv.bench.serving import run_load
from minikv.bench.peer_run import PROBES, RECORDED, peer_run
from minikv.serve.peer_venv import installed
from minikv.probe.report import FAIL, PASS
from minikv.probe.run import probe_endpoint
from minikv.serve.launch import ServerThread, free_port

ROOT = Path(__file__).resolve().parents[1]
POOL_TOKENS = 4096  # minikv serve's default pool: 256 pages x 16 tokens; the peer's: 128 blocks x 32


def children(pid: int) -> set[int]:
    """Every live descendant of `pid`, read from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def start_early() -> subprocess.Popen | None:
    """`python -m minikv peer serve vllm`, as a learner starts it (tests/conftest.py calls this at collection: it
    takes a minute)."""
    if not installed("vllm"):
        return None
    port = free_port()
    command = [sys.executable, "-m", "minikv", "peer", "serve", "vllm", "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    process.url = f"http://127.0.0.1:{port}"
    return process


@pytest.fixture(scope="module")
def peer(started_early):
    """The peer, once it answers; the last test stops it with SIGTERM."""
    process = started_early or start_early()
    if process is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and vLLM is not set up: .ci/run runs `python3 -m minikv peer setup vllm` first")
        pytest.skip("vLLM is not set up (python -m minikv peer setup vllm)")
    lines = []
    for line in process.stdout:  # "vllm serves tiny-llama on http://127.0.0.1:PORT/v1 ..." once it answers
        lines.append(line)
        if " serves " in line:
            break
    assert process.poll() is None, "".join(lines)
    yield process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


@pytest.fixture(scope="module")
def minikv_server(tiny):
    """`minikv serve` on a thread of this process, over the session's model (notebook 12 starts it so)."""
    with ServerThread(["--api-key", "a=sk-a-0001", "--api-key", "b=sk-b-0002"], *tiny) as server:
        yield server


def complete(url: str, prompt: str, salt: str | None = None, key: str = "sk-a-0001") -> tuple[int, float]:
    """One streamed greedy token: (cached_tokens, seconds to the first token)."""
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **({"cache_salt": salt} if salt else {})}
    start, first, usage = time.perf_counter(), None, {}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                event = json.loads(line[5:])
                if first is None and any(c.get("text") for c in event.get("choices") or []):
                    first = time.perf_counter() - start
                usage = event.get("usage") or usage
    return usage["prompt_tokens_details"]["cached_tokens"], first or time.perf_counter() - start


def random_prompt(rng: random.Random, tokens: int) -> str:
    """Random letters: one character is one token of the shipped model; no two prompts share a page."""
    return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(tokens - 1)) + "\n"


def test_greedy_text_equals_minikv(peer, minikv_server):
    """The 32 benchmark requests, 8 at a time: the same greedy text from vLLM as from minikv serve."""
    workload = bench_workload(32, seed=0)
    ours = asyncio.run(run_load(minikv_server.url, "tiny-llama", workload, 8, key="sk-a-0001")).texts
    theirs = asyncio.run(run_load(peer.url, "tiny-llama", workload, 8)).texts
    assert None not in ours and None not in theirs
    assert sum(a == b for a, b in zip(ours, theirs)) == len(workload) >= 20


def test_probe_finds_the_shared_prefix_cache(peer, minikv_server):
    """`minikv probe` against vLLM: its prefix cache is shared across keys (FAIL); minikv's salted one is not."""
    report = probe_endpoint(peer.url, "sk-a-0001", "sk-b-0002", seed=0)
    theirs = report.verdicts()
    ours = probe_endpoint(minikv_server.url, "sk-a-0001", "sk-b-0002", seed=0).verdicts()
    theirs.pop("over-length")  # its timing half reads noise on a loaded machine (a FAIL seen beside the browser check)
    assert theirs == {"canary": PASS, "prompt-token honesty": PASS, "shared prefix cache": FAIL}
    past_window = next(r for r in report.results if r.name == "over-length").exchanges[0][1]
    assert past_window.startswith("400"), past_window  # the half that does not rest on timing: refused
    assert ours["shared prefix cache"] == PASS


def test_cache_salt_keeps_another_salts_prompt_a_miss(peer):
    """vLLM's fix (cache_salt in the body): the same prompt under another salt reads nothing from the cache."""
    rng = random.Random(0)
    for _ in range(3):
        prompt = random_prompt(rng, 512)
        assert complete(peer.url, prompt, salt="salt-a")[0] == 0
        assert complete(peer.url, prompt, salt="salt-b")[0] == 0
        assert complete(peer.url, prompt, salt="salt-a")[0] == 480  # 15 whole blocks of 32; the rest recomputed
        assert complete(peer.url, prompt)[0] == 0  # no salt is a salt of its own


def test_the_recorded_run_is_what_a_fresh_run_finds(peer, tiny):
    """Notebook 12 shows data/vllm_run.json where vLLM is not set up: its verdicts must be today's. With a salt per
    key, both variants of the eviction check still fail vLLM: its free queue is one LRU for every salt."""
    recorded = json.loads(RECORDED.read_text())
    fresh = peer_run(peer.url, "tiny-llama", *tiny)
    assert fresh["same_text"] == recorded["same_text"] and fresh["past_window"] == recorded["past_window"]
    for name in PROBES:
        assert {c["name"]: c["verdict"] for c in fresh[name]["checks"]} == \
               {c["name"]: c["verdict"] for c in recorded[name]["checks"]}, name
    eviction = next(c for c in fresh["salted"]["checks"] if c["name"] == "shared eviction order")
    assert eviction["figures"]["variants"] == {"cache order": FAIL, "held pages": FAIL}, eviction["reason"]
    held = eviction["figures"]["held_pages"]  # a salt per key: B still reads A's pages
    assert min(held["b_survivors"]["repeat"]) - max(held["b_survivors"]["fresh"]) >= held["a_prompt_tokens"] / 2


def test_peer_serve_leaves_no_process_after_sigterm(peer):
    """SIGTERM to `peer serve` stops vLLM and its engine core: nothing of it is left (runs last)."""
    started = children(peer.pid)
    assert len(started) >= 2, started  # vLLM's API server and its engine core at least
    peer.send_signal(signal.SIGTERM)
    assert peer.wait(60) == 0
    time.sleep(1)
    assert not {pid for pid in started if Path(f"/proc/{pid}").exists()}
    assert "vllm stopped" in peer.stdout.read()


# -- setup errors: one line, exit status 2 (no peer needed) ------------------------------------------------
def test_setup_on_a_wrong_platform_or_a_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    import platform
    import shutil
    from types import SimpleNamespace

    from minikv.cli import main

    monkeypatch.setenv("MINIKV_PEERS_DIR", str(tmp_path))
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    assert main(["peer", "setup", "vllm"]) == 2
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=10**8))
    assert main(["peer", "setup", "vllm"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "riscv64" in err[0] and "0.1 GB free" in err[1] and "needs 4 GB" in err[1], err
    assert not any(tmp_path.iterdir())  # refused before anything was made


def test_setup_without_network_is_one_line(tmp_path, monkeypatch, capsys):
    """No index reachable (a closed port; no config, so no local wheels): one line naming the network."""
    from minikv.cli import main

    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    for name, value in {"MINIKV_PEERS_DIR": str(tmp_path), "PIP_CONFIG_FILE": os.devnull,
                        "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}.items():
        monkeypatch.setenv(name, value)  # read by this process (the peers' folder) and by the pip it runs
    code = main(["peer", "setup", "vllm"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the package index" in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "vllm-0.32.0" / "minikv-peer.json").exists()
