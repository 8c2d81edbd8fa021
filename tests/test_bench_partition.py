"""`bench --partition`: what the static partition costs against the shared pool. Nothing here is timed: the
figures must be the ones its runs give (capacity from the engines, hit rates and tokens/s from the runs)."""

from __future__ import annotations

import json
import statistics
from types import SimpleNamespace

from test_bench import tiny_random  # noqa: F401 - the fixture

from minikv.bench import partition
from minikv.bench.benchmark import run_command


def test_partition_figures_come_from_its_runs(tiny_random):  # noqa: F811
    """One tenant holds a quarter of the pool partitioned (one window of four), all of it shared, and fewer of its
    requests run at once; the hit rate, tokens/s and the paired ratio are the runs' own; the completions agree."""
    cost = partition.measure(*tiny_random, num_requests=16, repeats=2, seed=0)
    f = cost.figures()
    assert cost.outputs_equal and f["outputs_equal"] and f["rounds"] == len(cost.rounds) == 2
    assert 4 * f["partitioned"]["tenant_tokens"] == f["shared"]["tenant_tokens"] == 4 * 1024
    pages = -(-partition.CAPACITY_PROMPT_CHARS // 16)  # a running capacity request holds its prompt at least
    assert 1 <= f["partitioned"]["running_at_once"] <= 1024 // 16 // pages < f["shared"]["running_at_once"]
    for name in partition.POOLS:
        run = cost.checked[name]
        assert f[name]["hit_rate"] == run.cached_tokens / run.prompt_tokens and run.prompt_tokens > 0
        assert f[name]["tokens_per_s"] == statistics.median(r[name].tokens / r[name].wall_s for r in cost.rounds)
    ratios = [r["partitioned"].tokens_per_s / r["shared"].tokens_per_s for r in cost.rounds]
    assert f["throughput_ratios"] == ratios and f["throughput_ratio"] == statistics.median(ratios)


def test_bench_partition_command_prints_its_figures(tiny_random, capsys):  # noqa: F811
    """`python -m minikv bench --partition --quick --json`: one JSON object of both pools, exit 0 (same text)."""
    args = SimpleNamespace(partition=True, quick=True, repeats=None, requests=8, seed=0, json=True, threads=1)
    assert run_command(*tiny_random, args) == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) == {"partitioned", "shared", "throughput_ratio", "throughput_ratios", "rounds",
                           "outputs_equal"}
    assert figures["rounds"] == 1 and figures["outputs_equal"] is True
