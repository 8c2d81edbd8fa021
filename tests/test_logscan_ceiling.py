"""scan-logs' prefill-rate ceiling learned from the log itself (minikv/logs/ceiling.py, docs/logs.md)."""

from __future__ import annotations

import argparse
import json
import random
import tracemalloc
from pathlib import Path

from minikv.logs.ceiling import MAX_CANDIDATES, LearnedCeiling
from minikv.logs.gateway_log import parse_lines
from minikv.logs.scan import Signals, add_scan_logs_arguments, run_scan_logs, scan_log, scan_records

LEARNED = Signals(max_prefill_tokens_per_s=None)


def call(i: int, prompt_tokens: int, ttft_ms: float, model: str = "tiny-llama") -> dict:
    return {"timestamp": "2026-10-01T12:00:00Z", "request_id": f"r{i}", "account": "bob", "model": model,
            "prompt_tokens": prompt_tokens, "completion_tokens": 8, "ttft_ms": ttft_ms, "status": 200,
            "response_text": "saved."}


def fast_ids(rows: list[dict], signals: Signals = LEARNED) -> list[str]:
    result = scan_records(parse_lines([json.dumps(r) for r in rows]), signals=signals)
    return [f.record.request_id for f in result.flags if "ttft_anomaly" in f.reasons]


def quiet_log(rng: random.Random, sizes=(64, 96, 128, 160, 192, 224), rounds: int = 4) -> list[dict]:
    """Honest calls on a quiet server: 5 ms plus 0.1 ms a token, give or take 20%."""
    return [call(len(sizes) * k + j, n, (5 + 0.1 * n) * rng.uniform(0.8, 1.2))
            for k in range(rounds) for j, n in enumerate(sizes)]


def test_a_reply_under_the_ceiling_of_its_size_group_is_flagged():
    """Twenty honest 800-token reads at about 85 ms, and one back in 11.6 ms (69,000 tokens/s): the fixed
    100,000 ceiling misses it, the learned one flags it and nothing else."""
    rng = random.Random(0)
    rows = [call(i, 800, 85 * rng.uniform(0.8, 1.2)) for i in range(20)] + [call(99, 802, 11.6)]
    assert fast_ids(rows, Signals()) == []
    assert fast_ids(rows) == ["r99"]


def test_a_busy_log_flags_none_of_its_honest_rows():
    """32 clients queueing: times from 10 ms to seconds for one 22-token prompt; the unloaded ones are not leaks."""
    rng = random.Random(1)
    rows = [call(i, 22, rng.lognormvariate(5.3, 0.45)) for i in range(320)] + [call(900, 22, 10.6), call(901, 22, 11.0)]
    assert fast_ids(rows) == []


def test_a_prompt_too_large_for_any_learned_group_meets_the_trend():
    """The pair: honest prompts only up to 224 tokens (longer ones fail), then 800 tokens back in 11 ms: no group of
    its size to learn from, but the line through the smaller groups' fast times says a read takes ~85 ms."""
    rng = random.Random(2)
    honest = quiet_log(rng)
    assert fast_ids(honest + [call(99, 800, 11.0)]) == ["r99"]
    assert fast_ids(honest + [call(99, 800, 80.0 * rng.uniform(0.9, 1.1))]) == []  # read: as the trend says
    assert fast_ids(honest[:3] + [call(99, 800, 11.0)]) == []  # no trend from three rows: the fixed 100,000 applies


def test_each_model_is_its_own_reference():
    """A fast model's honest rows do not raise the ceiling of a slow one's, nor is the fast one flagged."""
    rng = random.Random(3)
    slow = [call(i, 800, 85 * rng.uniform(0.9, 1.1), "slow") for i in range(20)]
    fast = [call(100 + i, 800, 8 * rng.uniform(0.9, 1.1), "fast") for i in range(20)]
    assert fast_ids(slow + fast + [call(99, 800, 11.6, "slow")]) == ["r99"]


def test_the_learned_ceiling_keeps_a_bounded_number_of_rows():
    """However many rows a group has, it keeps its MAX_CANDIDATES fastest, and counts the rest that are above."""
    learned = LearnedCeiling(100_000.0)
    for record in parse_lines([json.dumps(call(i, 800, 80.0 + i % 7)) for i in range(5_000)]):
        learned.add(record, record.prompt_tokens / (record.ttft_ms / 1e3))
    [group] = learned.groups.values()
    assert len(group.fastest) == MAX_CANDIDATES and sum(group.bins.values()) == 5_000
    assert learned.outliers() == ([], 0)


def test_memory_stays_bounded_with_a_learned_ceiling(tmp_path: Path):
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(call(i, 700 + i % 50, 80.0 + i % 13)) + "\n" for i in range(12_000)))
    tracemalloc.start()
    try:
        result = scan_log(path, signals=LEARNED)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.scanned == 12_000 and not result.flags
    assert peak < path.stat().st_size / 5, f"peak {peak:,} bytes"


def test_the_command_line_learns_unless_given_a_ceiling(tmp_path: Path, capsys):
    rng = random.Random(4)
    rows = [call(i, 800, 85 * rng.uniform(0.8, 1.2)) for i in range(20)] + [call(99, 802, 11.6)]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parser = argparse.ArgumentParser()
    add_scan_logs_arguments(parser)
    assert run_scan_logs(parser.parse_args([str(log)])) == 1
    out = capsys.readouterr().out
    assert "r99  ttft_anomaly" in out and "learned from the log" in out and "tiny-llama 512-1,023 tokens: " in out
    assert run_scan_logs(parser.parse_args([str(log), "--max-prefill-rate", "100000"])) == 0
    assert "100,000 tokens/s" in capsys.readouterr().out
