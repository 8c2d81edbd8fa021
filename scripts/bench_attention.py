"""One layer's paged attention, request by request against one tiled call: `python scripts/bench_attention.py`.

The benchmark's prompts on a scattered pool: decode, and prefill of the first 20 prompts (1,891 tokens), with
PagedStep's tile shapes; both sides timed alternately, medians and minimums (docs/benchmarks.md).
"""

import argparse
import statistics

import torch

from minikv.bench.benchmark import PAGE_SIZE, bench_workload
from minikv.bench.roofline import paired_seconds, scattered_pool
from minikv.bench.systems import prompt_ids
from minikv.model.checkpoint import load_model
from minikv.attention.gather import gather_attention
from minikv.engine.paged_step import SeqSlice, block_table_tensor
from minikv.attention.tiles import tile_plan, tiled_attention


def median_and_min(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1e3:.2f} ms (min {min(seconds) * 1e3:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model()
    cfg = model.config
    lens = [len(p) for p in prompt_ids(tokenizer, bench_workload(32))]
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
            iters = args.iters if phase == "decode" else max(5, args.iters // 10)
            gathered, tiled = paired_seconds(list(contenders.values()), iters, warmup=2, summary=median_and_min)
        print(f"| {phase} | {len(q)} | {gathered} | {tiled} | {len(plan.tile_block)} of {block_q} x "
              f"{pages_per_tile * PAGE_SIZE} |")


if __name__ == "__main__":
    main()
