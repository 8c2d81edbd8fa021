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
EXPECTED_KEYS = ("device", "tokens_per_s", "ratios", "kv_waste", "outputs_equal", "roofline", "prefix_cache")
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


def values_as_matmul(monkeypatch) -> None:
    """FlopCounterMode counts matmuls, not embedding_bag: take the gathered product, the same FLOPs, in its place."""
    from minikv.attention import tiles

    def gathered(probs, v_pages, plan):
        n_tiles, kvh, _, bk = probs.shape
        return probs @ v_pages.reshape(-1, v_pages.shape[-1])[plan.kv_rows].view(n_tiles, kvh, bk, -1)

    monkeypatch.setattr(tiles, "weighted_values", gathered)


def test_forward_flops_equal_torch_flop_counter(monkeypatch):
    """forward_flops counts what torch's FlopCounterMode counts in a tiled paged decode step (contexts of whole pages)."""
    from torch.utils.flop_counter import FlopCounterMode

    values_as_matmul(monkeypatch)

    from minikv.bench.roofline import forward_flops
    from minikv.engine.page_pool import PagePool
    from minikv.engine.paged_step import CPU_TILES_MIN_BATCH, PagedStep, SeqSlice

    cfg = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=64)
    model, rows, context = Llama(cfg).eval(), CPU_TILES_MIN_BATCH, 20  # a batch that takes the tiles
    pool = PagePool(cfg, 5 * rows, page_size=4)
    slices = [SeqSlice(i + 1, pool.allocate(5, f"r{i}"), context - 1, 1) for i in range(rows)]  # 20 keys each
    step = PagedStep(pool, slices)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(rows, dtype=torch.long), step.positions, step)
    assert counter.get_total_flops() == forward_flops(cfg, rows, rows * context, rows)


def test_forward_flops_count_a_last_layer_that_runs_only_the_kept_rows(monkeypatch):
    """With last_keys, forward_flops counts what FlopCounterMode counts when the last layer runs each request's last row."""
    from torch.utils.flop_counter import FlopCounterMode

    values_as_matmul(monkeypatch)

    from minikv.bench.roofline import forward_flops
    from minikv.engine.page_pool import PagePool
    from minikv.engine.paged_step import CPU_TILES_MIN_BATCH, PagedStep, SeqSlice

    cfg = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=64)  # one layer: it is the last
    model, lens = Llama(cfg).eval(), [4 * (1 + i % 5) for i in range(CPU_TILES_MIN_BATCH)]  # whole pages: tiles count exactly
    pool = PagePool(cfg, sum(lens) // 4, page_size=4)
    slices = [SeqSlice(i + 1, pool.allocate(-(-n // 4), f"r{i}"), 0, n) for i, n in enumerate(lens)]  # prompts
    step = PagedStep(pool, slices)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(sum(lens), dtype=torch.long), step.positions, step, logits_index=step.last_rows,
              last_layer_on_logits_only=True)
    assert counter.get_total_flops() == forward_flops(cfg, sum(lens), 0, len(lens), last_keys=sum(lens))
    assert counter.get_total_flops() < forward_flops(cfg, sum(lens), sum(n * (n + 1) // 2 for n in lens), len(lens))


def test_json_roofline_has_the_issue_keys(tiny_random):
    """roofline in --json: decode_fraction, prefill_fraction, matmul_gflops, positive numbers."""
    model, tok = tiny_random
    from minikv.bench.roofline import measure_roofline

    roof = measure_roofline(model, [[1, 2, 3], [4, 5, 6, 7, 8]], page_size=4, iters=2)
    data = fake_report(roofline=roof).to_json()["roofline"]
    assert set(data) == {"decode_fraction", "prefill_fraction", "matmul_gflops"}
    assert all(isinstance(x, float) and x > 0 for x in data.values())


def test_figure_draws_the_roofline_panel():
    """The figure's roofline panel labels each step's fraction of its matmuls, or says it was not measured."""
    from minikv.bench.plot import bench_figure
    from minikv.bench.roofline import Roofline

    def roofline_texts(report) -> list[str]:
        fig = bench_figure(report)
        (ax,) = [a for a in fig.axes if a.get_title().startswith("roofline")]
        return [t.get_text() for t in ax.texts]

    assert roofline_texts(fake_report(roofline=Roofline(28.0, 84.0, 75.0, 90.0))) == ["33%", "83%"]
    assert roofline_texts(fake_report()) == ["not measured"]
