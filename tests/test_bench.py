"""The benchmark's own checks: its workload, its equality check, its JSON. Nothing here is timed."""

from __future__ import annotations

import re

import pytest
import torch

from minikv.bench import systems
from minikv.bench.benchmark import OUTPUT_BUDGETS, BenchSettings, bench_workload, mismatches, run_bench
from minikv.bench.report import BenchReport, median_run, p50_p99
from minikv.bench.systems import Completion
from minikv.bench.memory import contiguous_use, paged_use
from minikv.model.checkpoint import to_hf_model
from minikv.disagg.switches import SafetySwitches
from minikv.model.llama import Llama, ModelConfig
from minikv.model.tokenizer import build_char_tokenizer


# The `bench --json` contract, written out here rather than imported from the module it checks.
EXPECTED_KEYS = ("device", "tokens_per_s", "ratios", "kv_waste", "outputs_equal", "floor", "prefix_cache")
EXPECTED_RATIOS = {"vs_hf_sequential", "vs_hf_generate_batch", "paged_over_contiguous_step", "safe_over_vulnerable"}


@pytest.fixture(scope="module")
def tiny_random():
    """A 2-layer random Llama over the shipped vocabulary, with room for the whole context window.

    One thread: a model this small gains nothing from more, and loses a lot when the cores are busy.
    """
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                      num_kv_heads=1, head_dim=8, max_position_embeddings=1024)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Llama(cfg).eval(), tok
    torch.set_num_threads(threads)


def fake_report(**overrides) -> BenchReport:
    report = BenchReport("cpu (test)", "a test machine", "python -m minikv bench", 2, "one timed run per system")
    for name in ("hf_sequential", "hf_generate_batch", "minikv_paged", "pair_safe", "pair_vulnerable"):
        report.runs[name] = [systems.Run([Completion("x", 100)], [0.1, 0.2], 1.0)]
    report.step_s = {"paged": 0.011, "contiguous": 0.010}
    report.kv = {"paged": paged_use([97, 97], 4), "contiguous": contiguous_use([97, 97], 150),
                 "contiguous_window": contiguous_use([97, 97], 1000)}
    for key, value in overrides.items():
        setattr(report, key, value)
    return report


def documents_in(prompt: str) -> list[tuple[str, bool]]:
    """The prompt's documents (`read ...` sentences), each with whether it comes first, found by hand."""
    body = prompt.split(": ", 1)[1].removesuffix("\n")
    return [(m.group(1), m.start() == 0) for m in re.finditer(r"(?:^|\. )(read [a-z' -]+\.)", body)]


def test_workload_mix_counted_by_hand():
    """1,000 requests: 4 in 10 bare, 4 with a 20-120 character document (before or after the note), 2 with a
    200-600 one after it (each share within 4 standard deviations); every output budget drawn."""
    workload = bench_workload(1000, seed=0)
    found = [documents_in(r.prompt) for r in workload]
    assert all(len(docs) <= 1 for docs in found)
    docs = [d[0] for d in found if d]
    short, long = [d for d in docs if len(d[0]) < 200], [d for d in docs if len(d[0]) >= 200]
    assert abs(sum(not d for d in found) - 400) < 62 and abs(len(short) - 400) < 62
    assert abs(len(long) - 200) < 51
    assert all(20 <= len(text) <= 140 for text, _ in short)
    assert all(200 <= len(text) <= 620 for text, _ in long)
    assert any(before for _, before in short) and any(not before for _, before in short)
    assert not any(before for _, before in long)
    assert {r.max_tokens for r in workload} == set(OUTPUT_BUDGETS)
    assert bench_workload(16, seed=3) != bench_workload(16, seed=4)


def test_workload_mixes_prompt_and_output_lengths():
    """Prompts and output budgets both vary, and every prompt is one line ending in a newline."""
    workload = bench_workload(32)
    assert len(workload) == 32
    assert len({len(r.prompt) for r in workload}) > 10
    assert len({r.max_tokens for r in workload}) > 1
    assert all(r.prompt.endswith("\n") and r.prompt.count("\n") == 1 for r in workload)


def test_equality_check_finds_a_mismatching_output():
    """One different completion is reported by its index, and the report then says outputs differ."""
    reference = [Completion("saved pin 1234.", 16), Completion("saved nothing.", 15)]
    wrong = [Completion("saved pin 1234.", 16), Completion("saved pin 9999.", 16)]
    assert mismatches(reference, list(reference)) == []
    assert mismatches(reference, wrong) == [1]
    assert mismatches(reference, [reference[0], Completion("saved nothing.", 14)]) == [1]  # same text, other count
    report = fake_report(mismatched={"minikv_contiguous": [1]})
    assert report.outputs_equal is False and report.to_json()["outputs_equal"] is False


def test_completion_stops_where_the_engine_stops():
    """Generated ids are cut after the first EOS and at max_tokens; the EOS counts but is not text."""
    tok = build_char_tokenizer()
    ids = tok.encode("ok", add_special_tokens=False) + [tok.eos_token_id] + tok.encode("zz", add_special_tokens=False)
    assert systems.completion(tok, ids, 10) == Completion("ok", 3)
    assert systems.completion(tok, ids, 1) == Completion("o", 1)


def test_json_has_exactly_the_issue_keys():
    """device, tokens_per_s, ratios (four), kv_waste (paged, contiguous) as fractions, outputs_equal."""
    data = fake_report().to_json()
    assert tuple(data) == EXPECTED_KEYS
    assert set(data["ratios"]) == EXPECTED_RATIOS
    assert set(data["kv_waste"]) == {"paged", "contiguous"}
    assert data["kv_waste"] == {"paged": pytest.approx(3 / 100), "contiguous": pytest.approx(53 / 150)}
    assert data["ratios"]["paged_over_contiguous_step"] == pytest.approx(1.1)
    assert isinstance(data["device"], str) and data["outputs_equal"] is True


def test_json_reports_generate_batch_ratio_as_null_when_unavailable():
    """Without transformers' continuous batching the ratio is null, and the table says why."""
    report = fake_report(unavailable={"hf_generate_batch": "not in this version"})
    del report.runs["hf_generate_batch"]
    assert report.to_json()["ratios"]["vs_hf_generate_batch"] is None
    assert "unavailable: not in this version" in report.table()


def test_ratios_pair_the_runs_of_each_repeat():
    """A host that slows down between repeats slows both systems of a repeat alike: the ratio is
    the median of per-repeat ratios (0.9 here), not the ratio of two medians (1.5)."""
    def runs(walls):
        return [systems.Run([Completion("x", 100)], [0.1], w) for w in walls]

    safe, vulnerable = runs([1.0, 2.0, 10.0]), runs([0.9, 3.0, 9.0])
    report = fake_report(runs={"pair_safe": safe, "pair_vulnerable": vulnerable})
    assert report.results["pair_vulnerable"].wall_s / report.results["pair_safe"].wall_s == pytest.approx(1.5)
    assert report.ratios()["safe_over_vulnerable"] == pytest.approx(0.9)


def test_ttft_percentiles_interpolate_between_neighbours():
    """p99 of 0 and 10 is 9.9, of 1..101 it is 100, of one value that value; p50 is the median; none of nothing."""
    assert p50_p99([10.0, 0.0]) == (5.0, pytest.approx(9.9)) and p50_p99([float(x) for x in range(1, 102)])[1] == 100.0
    assert p50_p99([0.25]) == (0.25, 0.25) and p50_p99([]) == (None, None)
    assert p50_p99([0.4, 0.1, 0.2, 0.3])[0] == pytest.approx(0.25)


def test_summarize_keeps_the_run_with_the_median_wall_time():
    """Of walls 3, 1, 2, 4 the run of wall 2 (the lower middle) stands for the system."""
    runs = [systems.Run([Completion("x", 10)], [0.1], wall) for wall in (3.0, 1.0, 2.0, 4.0)]
    assert median_run(runs).wall_s == 2.0


def test_minikv_and_transformers_agree_on_a_random_model(tiny_random):
    """hf one-by-one, minikv contiguous and paged, and the safe pair return the same completions."""
    model, tok = tiny_random
    workload = bench_workload(3, seed=1)
    hf = to_hf_model(model, tok)
    reference = systems.hf_sequential(hf, tok, workload).completions
    assert all(1 <= c.tokens <= r.max_tokens for c, r in zip(reference, workload))
    for run in (systems.minikv_contiguous(model, tok, workload),
                systems.minikv_paged(model, tok, workload),
                systems.pair(model, tok, workload, SafetySwitches.preset("safe"))):
        assert mismatches(reference, run.completions) == []


def test_run_bench_end_to_end_json(tiny_random):
    """A whole (tiny) run gives the issue's JSON, with every system measured and outputs equal."""
    model, tok = tiny_random
    report = run_bench(model, tok, BenchSettings.quick(num_requests=2), progress=False)
    data = report.to_json()
    assert tuple(data) == EXPECTED_KEYS and set(data["ratios"]) == EXPECTED_RATIOS and data["outputs_equal"] is True
    assert {"hf_sequential", "minikv_contiguous", "minikv_paged", "pair_safe",
            "pair_vulnerable"} <= set(data["tokens_per_s"])
    assert all(0 <= w < 1 for w in data["kv_waste"].values())


def test_settings_refuse_a_run_with_nothing_to_time():
    """repeats=0 is only valid when the checked run itself is timed (--quick)."""
    with pytest.raises(ValueError, match="nothing to time"):
        BenchSettings(repeats=0)
    quick = BenchSettings.quick()
    assert quick.time_checked_run and quick.timed_runs == 1 and quick.num_requests == 32


def test_json_floor_comes_from_the_run(tiny_random):
    """floor in --json: the decode step's time against its matmuls plus one read of its K/V and weights, every
    figure measured (a floor no longer than the step it bounds, bytes counted from the model)."""
    from minikv.bench.roofline import decode_bytes, measure_floor

    model, _ = tiny_random
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    floor = measure_floor(model, prompts, page_size=4, iters=3)
    data = fake_report(floor=floor).to_json()["floor"]
    assert set(data) == {"floor_fraction", "step_ms", "floor_ms", "matmul_ms", "memory_ms", "bytes_read",
                         "bandwidth_gb_s"}
    assert 0 < data["matmul_ms"] < data["floor_ms"] <= data["step_ms"]
    assert data["floor_fraction"] == pytest.approx(data["floor_ms"] / data["step_ms"])
    weights = sum(p.numel() * 4 for name, p in model.named_parameters() if name != "embed_tokens.weight")
    assert data["bytes_read"] == decode_bytes(model, [3, 5]) == (4 + 6) * model.config.kv_bytes_per_token + weights


def test_figure_draws_the_floor_panel():
    """The figure's floor panel labels the step's floor fraction, or says it was not measured."""
    from minikv.bench.plot import bench_figure
    from minikv.bench.roofline import Floor

    def floor_texts(report) -> list[str]:
        fig = bench_figure(report)
        (ax,) = [a for a in fig.axes if a.get_title().startswith("decode step")]
        return [t.get_text() for t in ax.texts]

    assert floor_texts(fake_report(floor=Floor(0.010, 0.002, 10**7, 1e10))) == ["floor 30%"]
    assert floor_texts(fake_report()) == ["not measured"]
