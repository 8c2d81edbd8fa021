"""`python -m minikv bench --serve` on minikv alone: the paired rounds, the equality check, the JSON (no timings asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minikv.bench.benchmark import bench_workload
from minikv.bench.serving import requests_for, run_serving, save_serving_figure
from minikv.bench.systems import BenchRequest
from minikv.serve.launch import ServerThread

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(tiny):
    """`minikv serve` on a thread of this process, over the session's model."""
    with ServerThread([], *tiny) as s:
        yield s


def test_paired_rounds_on_twin_servers(server, tmp_path):
    """The same server under two names: every load checked, a ratio per round and client count, the figure."""
    urls = {"minikv": (server.url, "tiny-llama"), "twin": (server.url, "tiny-llama")}
    report = run_serving(urls, bench_workload(3), [1, 4], rounds=2, command="test", say=lambda _: None)
    assert not report.mismatched
    assert {c: len(r) for c, r in report.ratios().items()} == {1: 2, 4: 2}
    assert [len(report.loads[("twin", c)][0].texts) for c in (1, 4)] == [3, 6]  # 4 clients: the 3 requests twice
    row = report.row("minikv", 4)
    assert row["errors"] == 0 and row["tokens_per_s"] > 0 and row["itl_p50_ms"] <= row["itl_p99_ms"]
    assert "| 4 | **minikv / twin** |" in report.table()
    save_serving_figure(report, tmp_path / "serve.png")
    assert (tmp_path / "serve.png").stat().st_size > 0


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
    assert all(r["errors"] == 0 and r["tokens_per_s"] > 0 for r in report["results"].values())
    assert plot.stat().st_size > 0
