"""Where one engine step's time goes: `python scripts/profile_step.py [decode|prefill|attention] [--iters N]`.

The benchmark's 32 requests on a scattered pool, one torch thread. decode, prefill: torch.profiler's self time per
aten operation, its share and where it comes from. attention: one layer's paged attention, request by request
(gather + SDPA) against one tiled call with PagedStep's tile shapes, in decode and in a prefill of the first 20
prompts (1,891 tokens), both sides timed alternately, medians and minimums. docs/benchmarks.md quotes all three.
"""

import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from minikv.attention.gather import gather_attention
from minikv.attention.tiles import tile_plan, tiled_attention
from minikv.bench.benchmark import PAGE_SIZE, bench_workload
from minikv.bench.roofline import paged_step, paired_seconds, scattered_pool
from minikv.bench.systems import prompt_ids
from minikv.engine.paged_step import SeqSlice, block_table_tensor
from minikv.model.checkpoint import load_model
from minikv.model.llama import Llama

ROLE = {  # where each operation comes from in a step
    "aten::mm": "linear layers (qkv, o, gate_up, down, lm_head)",
    "aten::bmm": "attention: scores (and weighted values in prefill tiles)",
    "aten::index_select": "gather: K tiles (decode), each request's K/V (CPU prefill), embeddings",
    "aten::_embedding_bag_forward_only": "attention: weighted values straight from the pool (decode)",
    "aten::index": "gather: queries, logits rows, block tables",
    "aten::index_copy_": "scatter: new K/V into their slots",
    "aten::masked_fill_": "attention: causal mask",
    "aten::exp_": "attention: softmax",
    "aten::amax": "attention: softmax",
    "aten::scatter_add_": "attention: split-softmax sums",
    "aten::index_add_": "attention: split-softmax sums",
    "aten::fill_": "attention: zeroed sums, -inf maxima",
    "aten::scatter_reduce": "attention: split-softmax maxima",
    "aten::_fused_rms_norm": "RMSNorm",
    "aten::silu": "MLP",
    "aten::mul": "RoPE, MLP",
    "aten::sub_": "RoPE",
    "aten::add_": "RoPE, RMSNorm",
    "aten::pow": "RMSNorm (inside the fused call)",
    "aten::transpose": "views",
    "aten::add": "residuals, RoPE",
    "aten::cat": "RoPE, padding",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention: SDPA (CPU prefill, small batches)",
    "aten::sub": "tile plan, softmax",
    "aten::bitwise_not": "tile plan",
    "aten::as_strided": "views",
    "aten::matmul": "dispatch to mm/bmm",
    "aten::reshape": "views and copies",
    "aten::all": "the step's page check",
}


def operations(model: Llama, prompts: list[list[int]], phase: str, steps: int = 20) -> None:
    """The table of aten operations by self time per step."""
    step = paged_step(model, prompts, PAGE_SIZE, phase)
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in events)
    print(f"| operation | where | ms per {phase} step | share |\n| --- | --- | ---: | ---: |")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]:
        share = e.self_cpu_time_total / total
        print(f"| `{e.key}` | {ROLE.get(e.key, '')} | {e.self_cpu_time_total / steps / 1e3:.2f} | {share:.0%} |")
    print(f"| all aten operations | | {total / steps / 1e3:.2f} | 100% |")


def median_and_min(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1e3:.2f} ms (min {min(seconds) * 1e3:.2f})"


def attention(model: Llama, lens: list[int], iters: int) -> None:
    """The table of one layer's attention, gathered per request against one tiled call."""
    cfg = model.config
    pool, tables = scattered_pool(model, lens, PAGE_SIZE)
    pool.kv.normal_()
    cases = [("decode", [SeqSlice(i + 1, t, n, 1) for i, (t, n) in enumerate(zip(tables, lens))], (1, 1)),
             ("prefill", [SeqSlice(i + 1, t, 0, n) for i, (t, n) in enumerate(zip(tables, lens))][:20], (64, 4))]
    print("| phase | queries | per request (gather + SDPA) | one tiled call | tiles |\n| --- | ---: | ---: | ---: | ---: |")
    for phase, seqs, (block_q, pages_per_tile) in cases:
        q = torch.randn(sum(s.num_new for s in seqs), cfg.num_heads, cfg.head_dim)
        k_cache, v_cache = pool.flat(0)
        slots = [torch.tensor(pool.slots(s.block_table, 0, s.end)) for s in seqs]
        plan = tile_plan(block_table_tensor([s.block_table for s in seqs], pool.kv.device), torch.tensor([s.start for s in seqs]),
                         torch.tensor([s.num_new for s in seqs]), PAGE_SIZE, cfg.num_kv_heads, block_q, pages_per_tile)
        contenders = {"gather": lambda: gather_attention(q, k_cache, v_cache, slots, [s.start for s in seqs]),
                      "tiles": lambda: tiled_attention(q, pool.kv[0], plan)}
        with torch.inference_mode():
            assert torch.allclose(contenders["gather"](), contenders["tiles"](), atol=1e-5)
            phase_iters = iters if phase == "decode" else max(5, iters // 10)
            gathered, tiled = paired_seconds(list(contenders.values()), phase_iters, warmup=2, summary=median_and_min)
        print(f"| {phase} | {len(q)} | {gathered} | {tiled} | {len(plan.tile_block)} of {block_q} x "
              f"{pages_per_tile * PAGE_SIZE} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=["decode", "prefill", "attention"], default="decode")
    parser.add_argument("--iters", type=int, default=100, help="attention: timed decode calls (a tenth for prefill)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model()
    prompts = prompt_ids(tokenizer, bench_workload(32))
    if args.what == "attention":
        attention(model, [len(p) for p in prompts], args.iters)
    else:
        operations(model, prompts, args.what)


if __name__ == "__main__":
    main()
