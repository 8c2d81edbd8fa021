"""How close one engine step gets to the machine: its FLOP rate against plain matmuls of the same shapes.

A step's useful work is its matrix products: every linear layer of every token that runs, the
attention of each query over the keys it may see, and the vocabulary projection of the tokens
whose logits are kept. `forward_flops` counts them. The "roof" is what this machine does when
it does nothing but those linear layers' matmuls, at the same shapes, measured in the same run
(`matmul_rate`): a step that reached it would spend no time on gathers, softmax, norms, Python
or launches. `decode_fraction` and `prefill_fraction` are the step's FLOP rate over that rate,
both timed by the same clock (`busy_clock`: CPU time on a CPU, wall time on a GPU).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from minikv.model.llama import Llama, ModelConfig
from minikv.engine.page_pool import PagePool
from minikv.engine.paged_step import PagedStep, SeqSlice


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
        """The contract: the two fractions, and the decode shapes' matmul rate they are measured against."""
        return {"decode_fraction": self.decode_fraction, "prefill_fraction": self.prefill_fraction,
                "matmul_gflops": self.decode_matmul_gflops}


def forward_flops(config: ModelConfig, num_tokens: int, attended_keys: int, num_logits: int,
                  last_keys: int | None = None) -> int:
    """Multiply-adds x 2 of one forward over `num_tokens` new tokens.

    `attended_keys`: the (query, key) pairs attention computes, summed over the batch (a decode
    query over a context of S tokens is S pairs; a causal prompt of T tokens is T(T+1)/2).
    `last_keys`: when the last layer runs only the `num_logits` kept rows (Llama.forward with the
    `last_layer_on_logits_only`), the pairs its attention computes (each request's context length);
    that layer then runs its fused qkv projection for every token (K and V are kept) and the
    rest for the kept rows only. None: every layer runs every token.
    """
    h, d = config.hidden_size, config.head_dim
    qkv, o = h * (config.num_heads + 2 * config.num_kv_heads) * d, config.num_heads * d * h
    mlp = h * 2 * config.intermediate_size + config.intermediate_size * h  # gate_up, down
    per_token_linear = qkv + o + mlp

    def attention(pairs: int) -> int:
        return 2 * pairs * config.num_heads * d  # q.k and p.v for every pair and head

    if last_keys is None:
        layers = config.num_layers * (num_tokens * per_token_linear + attention(attended_keys))
    else:
        layers = (config.num_layers - 1) * (num_tokens * per_token_linear + attention(attended_keys)) \
            + num_tokens * qkv + num_logits * (o + mlp) + attention(last_keys)
    return 2 * (layers + num_logits * h * config.vocab_size)


def linear_weights(model: Llama) -> list[torch.Tensor]:
    """The weight of every linear layer in the decoder, in the order a forward uses them."""
    return [m.weight for layer in model.layers
            for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]


def linear_layers_only(model: Llama, num_tokens: int) -> tuple[Callable[[], object], int]:
    """The decoder's linear layers and nothing else, on `num_tokens` rows; and their FLOPs."""
    weights = linear_weights(model)
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
    """One engine step over the batch on a scattered pool: every prompt prefilled at once, or one
    token decoded after each prompt. The backend's construction (block tables, slot mapping, tiles),
    the forward and the greedy choice are all inside."""
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


def paired_seconds(first: Callable[[], object], second: Callable[[], object], iters: int,
                   clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """Median seconds of each by `clock`, timed alternately so that drift in the host hits both alike."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(iters + 1):  # one warm-up
        for fn, ts in zip((first, second), times):
            start = clock()
            fn()
            if i:
                ts.append(clock() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def busy_clock(device: torch.device) -> Callable[[], float]:
    """The clock a step's FLOP rate is divided by: this thread's CPU time on a CPU, wall time on a GPU.

    On a shared host the wall time of a CPU step includes the time its thread waits for a core
    (on the 2-core host of the README, a decode step of 6 ms of CPU took 22 ms of wall time at a
    load of 10), and a long step waits more often than a short burst of matmuls: the CPU time
    compares the engine's work with the matmuls' work, not the host's queue. A GPU's work does
    not show on the CPU clock, so there it is wall time (each step ends with a synchronizing copy).
    """
    return time.thread_time if device.type == "cpu" else time.perf_counter


def measure_roofline(model: Llama, prompts: list[list[int]], page_size: int, iters: int) -> Roofline:
    """The batch `prompts`: one decode step after them and a prefill of them all, each against its matmuls."""
    config, lens = model.config, [len(p) for p in prompts]
    rates = []
    for phase, rows, keys, last_keys, step_iters in (
            ("decode", len(lens), sum(n + 1 for n in lens), sum(n + 1 for n in lens), iters),
            ("prefill", sum(lens), sum(n * (n + 1) // 2 for n in lens), sum(lens), max(2, iters // 5))):
        matmuls, matmul_flops = linear_layers_only(model, rows)
        with torch.inference_mode():
            step_s, matmul_s = paired_seconds(paged_step(model, prompts, page_size, phase), matmuls, step_iters,
                                              busy_clock(model.device))
        rates += [forward_flops(config, rows, keys, len(lens), last_keys) / step_s / 1e9, matmul_flops / matmul_s / 1e9]
    return Roofline(*rates)
