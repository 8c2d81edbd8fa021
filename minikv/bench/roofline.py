"""How close the decode step gets to the machine: its time against a floor measured in the same run.

The floor is what the step cannot do without: its linear layers' matmuls, timed alone at the same shapes,
plus one read of the batch's K/V and the model's weights at the bandwidth a large tensor's sum shows
(docs/benchmarks.md, "the physical floor").
"""

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minikv.engine.page_pool import PagePool
from minikv.engine.paged_step import PagedStep, SeqSlice
from minikv.model.llama import Llama

BANDWIDTH_BYTES = 256 * 2**20  # the tensor summed to measure bandwidth: far past any CPU's last-level cache


@dataclass(frozen=True)
class Floor:
    """One decode step of a batch against its floor; every figure from the same run."""

    step_s: float  # the decode step
    matmul_s: float  # its linear layers alone, one row per request
    bytes_read: int  # the batch's K/V and the model's weights, once each
    bandwidth: float  # bytes per second a sum over BANDWIDTH_BYTES reads

    @property
    def memory_s(self) -> float:
        return self.bytes_read / self.bandwidth

    @property
    def floor_s(self) -> float:
        return self.matmul_s + self.memory_s

    @property
    def floor_fraction(self) -> float:
        return self.floor_s / self.step_s

    def to_json(self) -> dict[str, float]:
        return {"floor_fraction": self.floor_fraction, "step_ms": self.step_s * 1e3, "floor_ms": self.floor_s * 1e3,
                "matmul_ms": self.matmul_s * 1e3, "memory_ms": self.memory_s * 1e3, "bytes_read": self.bytes_read,
                "bandwidth_gb_s": self.bandwidth / 1e9}


def synced(fn: Callable[[], object], device: torch.device) -> Callable[[], object]:
    """`fn`, then a wait for the GPU to finish it (a GPU returns before the work is done)."""
    def run() -> object:
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    return run


def linear_layers_only(model: Llama, num_tokens: int) -> Callable[[], object]:
    """A step's matmuls alone, on `num_tokens` rows: every linear layer, and the output projection."""
    weights = [m.weight for layer in model.layers
               for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    weights.append(model.lm_head.weight)
    x = {w.shape[1]: torch.randn(num_tokens, w.shape[1], device=model.device, dtype=model.dtype)
         for w in weights}  # one input per width: (num_tokens, in)
    return synced(lambda: [F.linear(x[w.shape[1]], w) for w in weights], model.device)


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
    """One engine step on a scattered pool (prefill of every prompt, or a decode after each): forward,
    greedy."""
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
    """Median (or `summary`) seconds of each of `fns` by `clock`, timed in turn: host drift hits all alike."""
    times: list[list[float]] = [[] for _ in fns]
    for i in range(warmup + iters):
        for fn, ts in zip(fns, times):
            start = clock()
            fn()
            if i >= warmup:
                ts.append(clock() - start)
    return [summary(ts) for ts in times]


def read_bandwidth(device: torch.device) -> tuple[Callable[[], object], int]:
    """A sum over a tensor far larger than any cache, and the bytes it reads."""
    x = torch.ones(BANDWIDTH_BYTES // 4, device=device)  # float32
    return synced(x.sum, device), x.nbytes


def decode_bytes(model: Llama, lens: list[int]) -> int:
    """What a decode step after prompts of `lens` must read once: each request's K/V (its prompt and the new
    token) and every weight but the embedding table, of which it reads a row a request (unless it is tied to
    the output projection, which reads all of it)."""
    kv = sum(n + 1 for n in lens) * model.config.kv_bytes_per_token
    return kv + sum(p.numel() * p.element_size() for name, p in model.named_parameters()
                    if name != "embed_tokens.weight" or p is model.lm_head.weight)


def measure_floor(model: Llama, prompts: list[list[int]], page_size: int, iters: int) -> Floor:
    """A decode step after `prompts` against its matmuls and the bandwidth, timed in turn; by this thread's
    CPU time on a CPU (a shared host's waits for a core would count), wall time on a GPU."""
    lens = [len(p) for p in prompts]
    clock = time.thread_time if model.device.type == "cpu" else time.perf_counter
    matmuls = linear_layers_only(model, len(lens))
    bandwidth, nbytes = read_bandwidth(model.device)
    with torch.inference_mode():
        step = paged_step(model, prompts, page_size, "decode")
        step_s, matmul_s, sum_s = paired_seconds([step, matmuls, bandwidth], iters, warmup=2, clock=clock)
    return Floor(step_s, matmul_s, decode_bytes(model, lens), nbytes / sum_s)
