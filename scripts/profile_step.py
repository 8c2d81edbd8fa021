"""Where one engine step's time goes: `python scripts/profile_step.py [decode|prefill|attention|bound|audit|compile] [--iters N]`.

The benchmark's 32 requests on a scattered pool, one torch thread. decode, prefill: torch.profiler's self time per
aten operation, its share and where it comes from. attention: one layer's paged attention, request by request
(gather + SDPA) against one tiled call with PagedStep's tile shapes, in decode and in a prefill of the first 20
prompts (1,891 tokens), both sides timed alternately, medians and minimums. bound: floor_fraction of the step,
of the step with attention taken out, and of wider models (random weights). audit: a decode step of 32 and of 128
requests with the ownership audit on and off, each request reading its prompt's full pages from an earlier request
that sent the same prompt (the prefix cache, as `serve` sees it under closed-loop clients): aten calls per step and
step times, timed alternately. compile: a decode step of 8 to 128 requests with the layers' dense parts compiled by
torch.compile (graphs split at the paged attention, as vLLM splits them; the tile plan built in PagedStep, outside),
against eager, timed alternately. docs/benchmarks.md quotes all six.
"""

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from unittest.mock import patch

import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from minikv.attention.gather import gather_attention
from minikv.attention.tiles import tile_plan, tiled_attention
from minikv.bench.benchmark import PAGE_SIZE, bench_workload
from minikv.bench.roofline import measure_floor, paged_step, paired_seconds, scattered_pool
from minikv.bench.systems import prompt_ids
from minikv.engine.audit import OwnershipAudit
from minikv.engine.page_pool import PagePool
from minikv.engine.paged_step import PagedStep, SeqSlice, block_table_tensor
from minikv.model.checkpoint import load_model
from minikv.model.llama import Llama, Rotary

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


def bound(model: Llama, prompts: list[list[int]], iters: int) -> None:
    """floor_fraction of the decode step, of the same step with attention taken out (its K/V still stored), and
    of wider models of the same shape (random weights): what bounds the fraction at the shipped model's width."""
    floor = measure_floor(model, prompts, PAGE_SIZE, iters)
    step = paged_step(model, prompts, PAGE_SIZE, "decode")

    def store_only(self: PagedStep, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   last_only: bool = False) -> torch.Tensor:
        self.store(layer, k, v)
        return q  # attention's output replaced by its input

    def without_attention() -> list[int]:
        with patch.object(PagedStep, "attend", store_only):
            return step()

    with torch.inference_mode():
        full, bare = paired_seconds([step, without_attention], iters, warmup=3, clock=time.thread_time)
    print(f"step {full * 1e3:.2f} ms, without attention {bare * 1e3:.2f} ms; floor {floor.floor_s * 1e3:.2f} ms "
          f"(matmuls {floor.matmul_s * 1e3:.2f} ms + {floor.bytes_read / 2**20:.1f} MiB at "
          f"{floor.bandwidth / 1e9:.1f} GB/s): floor_fraction {floor.floor_s / full:.2f}, without attention "
          f"{floor.floor_s / bare:.2f}")
    for hidden, heads in ((192, 4), (512, 8), (1024, 16)):
        torch.manual_seed(0)
        wider = dataclasses.replace(model.config, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                                    num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads)
        wide_floor = measure_floor(Llama(wider).eval(), prompts, PAGE_SIZE, 20)
        print(f"hidden {hidden}: floor_fraction {wide_floor.floor_fraction:.2f}")


def shared_prefix_step(model: Llama, prompts: list[list[int]], batch: int, audit: bool):
    """One decode step of `batch` requests (the prompts over again), each reading its prompt's full pages from the
    earlier request that sent it (retired, its pages cached) and the rest from its own; with the audit or without."""
    ps, lens = PAGE_SIZE, [len(prompts[i % len(prompts)]) for i in range(batch)]
    shared = [n // ps for n in lens[: len(prompts)]]  # full prompt pages, one copy per distinct prompt
    own = [-(-(n + 1) // ps) - shared[i % len(prompts)] for i, n in enumerate(lens)]
    pages = torch.randperm(sum(shared) + sum(own), generator=torch.Generator().manual_seed(0)).tolist()  # scattered
    pool = PagePool(model.config, len(pages), ps, model.device, model.dtype)
    ledger = OwnershipAudit(len(pages) * ps, ps, "node", model.device) if audit else None
    cached = [[pages.pop() for _ in range(k)] for k in shared]
    slices = []
    for i, n in enumerate(lens):
        writer, reader = i % len(prompts) + 1, len(prompts) + i + 1
        table = cached[writer - 1] + [pages.pop() for _ in range(own[i])]
        slices.append(SeqSlice(reader, table, n, 1))
        if ledger is not None:
            prompt = prompts[writer - 1]
            for uid in (writer, reader):
                ledger.register(uid, f"r{uid}", "bench", prompt)
            full = shared[writer - 1] * ps
            slots = torch.tensor(pool.slots(table, 0, n))
            ledger.record_writes(slots, torch.tensor([writer] * full + [reader] * (n - full)), torch.arange(n))
    ids = torch.zeros(batch, dtype=torch.long, device=model.device)

    @torch.inference_mode()
    def run() -> list[int]:
        step = PagedStep(pool, slices, ledger)
        logits = model(ids, step.positions, step, logits_index=step.last_rows, last_layer_on_logits_only=True)
        assert not step.findings, "a shared prefix read is not a finding"
        return logits.argmax(-1).tolist()

    return run


def audit_cost(model: Llama, prompts: list[list[int]], iters: int) -> None:
    """aten calls per decode step and step time, ownership audit on and off, at 32 and 128 requests."""
    print("| requests | aten calls, audit on | audit off | step, audit on | audit off | on / off |\n"
          "| ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch in (32, 128):
        steps = [shared_prefix_step(model, prompts, batch, audit) for audit in (True, False)]
        calls = []
        for step in steps:
            step()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step()
            calls.append(sum(e.count for e in prof.key_averages() if e.key.startswith("aten::")))
        on, off = paired_seconds(steps, iters, warmup=3, clock=time.thread_time, summary=lambda ts: ts)
        ratio = statistics.median(a / b for a, b in zip(on, off))
        print(f"| {batch} | {calls[0]:,} | {calls[1]:,} | {median_and_min(on)} | {median_and_min(off)} | {ratio:.3f} |")


def piecewise_compiled(model: Llama, batch_ids: torch.Tensor) -> Callable[[PagedStep], list[int]]:
    """A decode forward with each layer's norm, projections, RoPE and MLP compiled (fixed shapes: one graph per
    batch size, as a bucket would be), the paged attention eager between them; greedy."""
    H, KVH, D = model.config.num_heads, model.config.num_kv_heads, model.config.head_dim

    def before_attention(layer, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        qkv = layer.self_attn.qkv_proj(layer.input_layernorm(x)).view(len(x), H + 2 * KVH, D)  # (B, H + 2 KVH, D)
        qk = Rotary.rotate(qkv[:, : H + KVH], (cos, sin))
        return qk[:, :H].contiguous(), qk[:, H:].contiguous(), qkv[:, H + KVH :].contiguous()

    def after_attention(layer, x: Tensor, out: Tensor) -> Tensor:
        x = x + layer.self_attn.o_proj(out.reshape(len(x), H * D))  # (B, hidden)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    compiled = [torch.compile(f, dynamic=False, fullgraph=True) for f in (before_attention, after_attention)]
    head = torch.compile(lambda x: model.lm_head(model.norm(x)), dynamic=False, fullgraph=True)

    @torch.inference_mode()
    def run(step: PagedStep) -> list[int]:
        x = model.embed_tokens(batch_ids)  # (B, hidden)
        cos, sin = model.rotary.cos_sin(step.positions, x.dtype)
        for layer in model.layers:
            q, k, v = compiled[0](layer, x, cos, sin)
            x = compiled[1](layer, x, step.attend(layer.self_attn.layer, q, k, v))
        return head(x).argmax(-1).tolist()

    return run


def compile_cost(model: Llama, prompts: list[list[int]], iters: int) -> None:
    """A decode step, the dense parts compiled (piecewise) against eager, at 8 to 128 requests."""
    print("| requests | compile time (s) | eager step (ms CPU) | compiled step | eager / compiled | same tokens |\n"
          "| ---: | ---: | ---: | ---: | ---: | --- |")
    for batch in (8, 32, 64, 128):
        lens = [len(p) for p in (prompts * 8)[:batch]]
        pool, tables = scattered_pool(model, lens, PAGE_SIZE)
        slices = [SeqSlice(i + 1, t, n, 1) for i, (t, n) in enumerate(zip(tables, lens))]
        ids = torch.zeros(batch, dtype=torch.long, device=model.device)
        torch._dynamo.reset()
        forward = piecewise_compiled(model, ids)

        @torch.inference_mode()
        def eager() -> list[int]:
            step = PagedStep(pool, slices)
            return model(ids, step.positions, step).argmax(-1).tolist()

        def compiled() -> list[int]:
            return forward(PagedStep(pool, slices))
        start = time.perf_counter()
        same = compiled() == eager()
        took = time.perf_counter() - start
        e, c = paired_seconds([eager, compiled], iters, warmup=3, clock=time.thread_time)
        print(f"| {batch} | {took:.1f} | {1e3 * e:.2f} | {1e3 * c:.2f} | {e / c:.2f}x | {same} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=["decode", "prefill", "attention", "bound", "audit", "compile"], default="decode")
    parser.add_argument("--iters", type=int, default=100, help="attention: timed decode calls (a tenth for prefill)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model()
    prompts = prompt_ids(tokenizer, bench_workload(32))
    if args.what == "attention":
        attention(model, [len(p) for p in prompts], args.iters)
    elif args.what == "audit":
        audit_cost(model, prompts, min(args.iters, 50))
    elif args.what == "compile":
        compile_cost(model, prompts, min(args.iters, 50))
    elif args.what == "bound":
        bound(model, prompts, min(args.iters, 50))
    else:
        operations(model, prompts, args.what)


if __name__ == "__main__":
    main()
