"""`python -m minikv bench --serve` on minikv alone: the paired rounds, the equality check, the JSON (no timings asserted)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import openai
import pytest
from fake_endpoint import FakeEndpoint, events

from minikv.bench import serving, systems
from minikv.bench.benchmark import bench_workload
from minikv.bench.serving import LATENCIES, requests_for, run_load, run_serving, serving_figure
from minikv.bench.systems import BenchRequest, Completion
from minikv.model.checkpoint import to_hf_model
from minikv.serve.launch import ServerThread

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(tiny):
    """`minikv serve` on a thread of this process, over the session's model."""
    with ServerThread([], *tiny) as s:
        yield s


def test_paired_rounds_on_twin_servers(server):
    """The same server under two names: every load checked, a ratio per round and client count, the figure."""
    urls = {"minikv": (server.url, "tiny-llama"), "twin": (server.url, "tiny-llama")}
    report = run_serving(urls, bench_workload(3), [1, 4], rounds=2, command="test", say=lambda _: None)
    assert not report.mismatched
    assert {c: len(r) for c, r in report.ratios().items()} == {1: 2, 4: 2}
    assert [len(report.loads[("twin", c)][0].texts) for c in (1, 4)] == [3, 6]  # 4 clients: the 3 requests twice
    assert "| 4 | **minikv / twin** |" in report.table()
    figure = serving_figure(report)
    throughput, ttft = ([list(line.get_ydata()) for line in ax.lines] for ax in figure.axes[:2])
    assert throughput == [[report.row(s, c)["tokens_per_s"] for c in (1, 4)] for s in ("minikv", "twin")]
    assert ttft == [[report.row(s, c)["ttft_p99_ms"] for c in (1, 4)] for s in ("minikv", "twin")]


def test_a_load_streams_what_transformers_generates(server, tiny):
    """Over HTTP, through the openai client: each request's text and token count are transformers' own; one
    time to first token per request, within the load's wall time; a latency where 2 or more tokens came."""
    model, tok = tiny
    workload = bench_workload(3)
    reference = systems.hf_sequential(to_hf_model(model, tok), tok, workload).completions
    load = asyncio.run(run_load(server.url, "tiny-llama", workload, clients=2))
    assert load.completions == reference
    assert len(load.ttft_s) == len(workload) and all(0 < t < load.wall_s for t in load.ttft_s)
    assert len(load.itl_s) == sum(c.tokens > 1 for c in reference)
    assert all(0 < t < load.wall_s for t in load.itl_s)
    assert load.tokens_per_s == sum(c.tokens for c in reference) / load.wall_s


def test_ttft_and_itl_on_a_counting_clock(monkeypatch):
    """A clock that ticks once per reading: TTFT ends at the first chunk with text (not an empty first chunk),
    the latency spreads from there to the last chunk with choices over the usage's tokens but the first."""
    ticks = itertools.count()
    monkeypatch.setattr(serving, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    chunks = [{"choices": [{"index": 0, "text": ""}]},
              *({"choices": [{"index": 0, "text": t}]} for t in "abc"),
              {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
              {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}}]

    async def one(url: str):
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as api:
            return await serving.stream_one(api, "fake", BenchRequest("hi\n", 4))

    with FakeEndpoint(completions=lambda h, body: events(h, *chunks)) as fake:
        completion, ttft, itl = asyncio.run(one(fake.url))
    assert completion == Completion("abc", 4)
    assert (ttft, itl) == (2.0, (5.0 - 2.0) / 3)  # reads: start 0, chunks 1 to 5 (text from 2)


def test_a_refused_request_is_a_mismatch_and_nothing_is_timed(server):
    too_long = BenchRequest("x" * 1100 + "\n", 16)  # past the 1,024-token window: refused, 400
    urls = {"minikv": (server.url, "tiny-llama"), "twin": (server.url, "tiny-llama")}
    report = run_serving(urls, [*bench_workload(2), too_long], [2], rounds=1, command="test", say=lambda _: None)
    assert report.mismatched == [2] and not report.loads


def test_requests_for_repeats_the_workload_up_to_the_clients():
    workload = bench_workload(4)
    assert requests_for(workload, 1) == workload and requests_for(workload, 9) == workload * 3


def test_bench_serve_command_on_minikv_alone(tmp_path):
    plot = tmp_path / "serve.png"
    run = subprocess.run([sys.executable, "-m", "minikv", "bench", "--serve", "--no-peer", "--requests", "2",
                          "--clients", "1,2", "--rounds", "1", "--json", "--plot", str(plot)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["servers"] == ["minikv"] and report["outputs_equal"] and report["ratios"] == {}
    assert set(report["results"]) == {"minikv@1", "minikv@2"}
    results = report["results"].values()
    assert all(r["errors"] == 0 and None not in [r[key] for key in LATENCIES] for r in results)
    assert plot.read_bytes().startswith(b"\x89PNG")  # what it draws: test_paired_rounds_on_twin_servers
