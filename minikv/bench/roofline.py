"""How close one engine step gets to the machine: its FLOP rate against plain matmuls of the same shapes.

`forward_flops` counts a step's useful work; `linear_layers_only` is the roof, the linear layers' matmuls
alone at the same shapes in the same run (docs/benchmarks.md, "the roofline").
"""

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minikv.engine.page_pool import PagePool
from minikv.engine.paged_step import PagedStep, SeqSlice
from minikv.model.llama import Llama, ModelConfig


@dataclass(frozen=True)
class Roofline:
    """A step's achieved GFLOP/s against the matmul GFLOP/s of the same shapes."""

    decode_gflops: float  # the batch's decode step
    decode_matmul_gflops: float  # the linear layers alone, one row per request
    prefill_gflops: float  # every prompt of the batch prefilled in one step
    prefill_matmul_gflops: float  # the linear layers alone, one row per prompt token

    @property
    def decode_fraction(self) -> float:
        return self.decode_gflops / self.decode_matmul_gflops

    @property
    def prefill_fraction(self) -> float:
        return self.prefill_gflops / self.prefill_matmul_gflops

    def to_json(self) -> dict[str, float]:
        """The two fractions, and the decode shapes' matmul rate they are measured against."""
        return {"decode_fraction": self.decode_fraction, "prefill_fraction": self.prefill_fraction,
                "matmul_gflops": self.decode_matmul_gflops}


def forward_flops(config: ModelConfig, num_tokens: int, attended_keys: int, num_logits: int,
                  last_keys: int | None = None) -> int:
    """2 x multiply-adds of a forward over `num_tokens` tokens; `attended_keys`: the batch's (query, key) pairs,
    `last_keys`: those of a last layer run past qkv for the `num_logits` rows only (docs/benchmarks.md)."""
    h, d = config.hidden_size, config.head_dim
    qkv, o = h * (config.num_heads + 2 * config.num_kv_heads) * d, config.num_heads * d * h
    mlp = h * 2 * config.intermediate_size + config.intermediate_size * h  # gate_up, down

    def layer(tokens: int, rows: int, pairs: int) -> int:  # q.k and p.v for every pair and head
        return tokens * qkv + rows * (o + mlp) + 2 * pairs * config.num_heads * d

    if last_keys is None:
        layers = config.num_layers * layer(num_tokens, num_tokens, attended_keys)
    else:
        layers = (config.num_layers - 1) * layer(num_tokens, num_tokens, attended_keys) \
            + layer(num_tokens, num_logits, last_keys)
    return 2 * (layers + num_logits * h * config.vocab_size)


def linear_layers_only(model: Llama, num_tokens: int) -> tuple[Callable[[], object], int]:
    """The decoder's linear layers and nothing else, on `num_tokens` rows; and their FLOPs."""
    weights = [m.weight for layer in model.layers
               for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    x = {w.shape[1]: torch.randn(num_tokens, w.shape[1], device=model.device, dtype=model.dtype)
         for w in weights}  # one input per width: (num_tokens, in)

    def run() -> object:
        out = [F.linear(x[w.shape[1]], w) for w in weights]
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)  # a GPU returns before the work is done
        return out

    return run, 2 * num_tokens * sum(w.numel() for w in weights)


def scattered_pool(model: Llama, lens: list[int], page_size: int) -> tuple[PagePool, list[list[int]]]:
    """A pool holding each request's `lens[i] + 1` tokens, pages handed out round-robin (scattered)."""
    need = [-(-(n + 1) // page_size) for n in lens]
    pool = PagePool(model.config, sum(need), page_size, model.device, model.dtype)
    tables: list[list[int]] = [[] for _ in lens]
    while any(len(t) < n for t, n in zip(tables, need)):
        for i, t in enumerate(tables):
            if len(t) < need[i]:
                t += pool.allocate(1, f"r{i}")
    return pool, tables


def paged_step(model: Llama, prompts: list[list[int]], page_size: int, phase: str) -> Callable[[], list[int]]:
    """One engine step on a scattered pool (all prompts prefilled, or a token decoded after each): backend, forward,
    greedy choice."""
    device, lens = model.device, [len(p) for p in prompts]
    pool, tables = scattered_pool(model, lens, page_size)
    if phase == "prefill":
        slices = [SeqSlice(i + 1, t, 0, n) for i, (t, n) in enumerate(zip(tables, lens))]
        ids = torch.tensor([tok for p in prompts for tok in p], device=device)  # (N,)
    else:
        slices = [SeqSlice(i + 1, t, n, 1) for i, (t, n) in enumerate(zip(tables, lens))]
        ids = torch.zeros(len(lens), dtype=torch.long, device=device)  # (B,)

    @torch.inference_mode()
    def run() -> list[int]:
        step = PagedStep(pool, slices)
        logits = model(ids, step.positions, step, logits_index=step.last_rows, last_layer_on_logits_only=True)
        return logits.argmax(-1).tolist()  # as the engine runs

    return run


def paired_seconds(fns: Sequence[Callable[[], object]], iters: int, warmup: int = 1,
                   clock: Callable[[], float] = time.perf_counter, summary: Callable = statistics.median) -> list:
    """Median (or `summary`) seconds of each of `fns` by `clock`, timed in turn so that host drift hits all alike."""
    times: list[list[float]] = [[] for _ in fns]
    for i in range(warmup + iters):
        for fn, ts in zip(fns, times):
            start = clock()
            fn()
            if i >= warmup:
                ts.append(clock() - start)
    return [summary(ts) for ts in times]


def measure_roofline(model: Llama, prompts: list[list[int]], page_size: int, iters: int) -> Roofline:
    """A decode step after `prompts` and a prefill of them all, each against its matmuls; timed by this thread's
    CPU time on a CPU (a shared host's waits for a core would count), wall time on a GPU."""
    config, lens = model.config, [len(p) for p in prompts]
    clock = time.thread_time if model.device.type == "cpu" else time.perf_counter
    rates = []
    for phase, rows, keys, last_keys, step_iters in (
            ("decode", len(lens), sum(n + 1 for n in lens), sum(n + 1 for n in lens), iters),
            ("prefill", sum(lens), sum(n * (n + 1) // 2 for n in lens), sum(lens), max(2, iters // 5))):
        matmuls, matmul_flops = linear_layers_only(model, rows)
        with torch.inference_mode():
            step_s, matmul_s = paired_seconds([paged_step(model, prompts, page_size, phase), matmuls], step_iters,
                                              clock=clock)
        rates += [forward_flops(config, rows, keys, len(lens), last_keys) / step_s / 1e9, matmul_flops / matmul_s / 1e9]
    return Roofline(*rates)
