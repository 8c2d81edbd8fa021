"""What notebook 12 shows of a real engine: `peer_run` against a served peer counts the greedy replies equal
to minikv's, tries a prompt past the window, and probes it unsalted and salted per key; without a peer,
notebook 12 reads RECORDED, written by `python -m minikv.bench.peer_run`."""

import asyncio
import datetime
import json
import os
import platform
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from transformers import PreTrainedTokenizerBase

from minikv.bench.benchmark import bench_workload
from minikv.bench.serving import run_load
from minikv.bench.systems import serve_all
from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.model.llama import Llama
from minikv.probe.run import probe_endpoint
from minikv.serve.peer_venv import installed

RECORDED = Path(__file__).resolve().parents[2] / "data" / "vllm_run.json"
KEYS = ("sk-tenant-a", "sk-tenant-b")  # the peer takes any bearer key: to it, these are two tenants only by salt
PROBES = {
    "shared": {"seed": 0, "checks": ["canary", "honesty", "prefix-cache"]},
    "salted": {"seed": 0, "checks": ["prefix-cache", "eviction"], "salt_per_key": True,
               "budget": 300},  # the eviction check: two variants, each priming a pool of 4,096 tokens
}
REQUESTS = 24  # of the benchmark's workload, for the same-text check
PAST_WINDOW = 1100  # tokens (characters, for the shipped model): past the 1,024-token window


def same_text(url: str, served: str, model: Llama, tok: PreTrainedTokenizerBase, requests: int = REQUESTS) -> dict:
    """The benchmark's first `requests` requests, greedy: minikv's engine in-process against the peer."""
    workload = bench_workload(requests, seed=0)
    ours = serve_all(Engine(model, tok, EngineConfig(num_pages=256, event_log=False)), workload).texts
    with ThreadPoolExecutor(1) as pool:  # a thread of its own: a notebook's kernel already runs an event loop
        theirs = pool.submit(asyncio.run, run_load(url, served, workload, clients=8)).result().texts
    return {"requests": requests, "equal": sum(a == b for a, b in zip(ours, theirs))}


def past_the_window(url: str, served: str) -> dict:
    """A prompt past the window: the status and the error message the peer answers."""
    reply = httpx.post(url + "/v1/completions", json={"model": served, "prompt": "a" * (PAST_WINDOW - 1) + "\n",
                                                      "max_tokens": 1}, timeout=60)
    return {"prompt_tokens": PAST_WINDOW, "status": reply.status_code, "error": reply.json().get("error", {}).get("message")}


def peer_run(url: str, served: str, model: Llama, tok: PreTrainedTokenizerBase) -> dict:
    """The record notebook 12 reads (`served`: the peer's model name). The refusal past the window is read
    directly: the probe's over-length check times prefill, too close to call where a window takes 30 ms."""
    run = {"same_text": same_text(url, served, model, tok), "past_window": past_the_window(url, served)}
    for name, settings in PROBES.items():
        run[name] = probe_endpoint(url, *KEYS, **{**settings, "checks": tuple(settings["checks"])}).to_json()
    return run


def record(path: Path = RECORDED) -> dict:
    """Start vLLM (`peer serve`'s settings), run everything, write the record with when, what and where."""
    from minikv.model.checkpoint import load_model
    from minikv.serve.peer import PeerServer
    versions = installed("vllm")
    assert versions, "vLLM is not set up: python -m minikv peer setup vllm"
    with PeerServer() as peer:
        run = peer_run(peer.url, peer.model, *load_model())
    run = {"recorded": datetime.date.today().isoformat(), "command": "python -m minikv.bench.peer_run",
           "versions": {k: versions[k] for k in ("vllm", "torch", "transformers")},
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}", **run}
    path.write_text(json.dumps(run, indent=1) + "\n")
    return run


if __name__ == "__main__":
    print(f"wrote {RECORDED}: " + json.dumps({k: v for k, v in record().items() if k in ("recorded", "same_text")}))
