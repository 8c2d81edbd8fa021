"""Where one engine step's time goes, by operation: `python scripts/profile_step.py [decode|prefill]`.

The benchmark's 32 requests on a scattered pool under torch.profiler: a markdown table of each aten operation's
self time per step, its share and where it comes from (docs/benchmarks.md quotes it).
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from minikv.bench.benchmark import PAGE_SIZE, bench_workload
from minikv.bench.roofline import paged_step
from minikv.bench.systems import prompt_ids
from minikv.model.checkpoint import load_model

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


def main(phase: str = "decode", steps: int = 20) -> None:
    torch.set_num_threads(1)
    model, tokenizer = load_model()
    step = paged_step(model, prompt_ids(tokenizer, bench_workload(32)), PAGE_SIZE, phase)
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


if __name__ == "__main__":
    main(*sys.argv[1:2])
