"""Static batching over a contiguous cache: the serving engine *before* page pools.

Every request of the batch reserves one row of `ContiguousCache` at the start, as long as the
longest request could ever get (prompt + max_tokens), and keeps it until the whole batch ends.
Each prompt is prefilled on its own, then every unfinished row decodes one token per step.
This is the benchmarks' "minikv contiguous": the same model and the same greedy choice as the
paged engine, so the outputs must be identical; only where the keys and values live differs,
and how much memory sits reserved for tokens that never come.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from minikv.model.contiguous_cache import ContiguousCache
from minikv.model.llama import Llama


@dataclass
class StaticBatchResult:
    """Per request: generated ids (the EOS included when produced) and seconds to the first."""

    output_ids: list[list[int]]
    first_token_s: list[float]
    reserved_slots: int  # rows x max_len, held from the first step to the last


@torch.inference_mode()
def generate_static_batch(
    model: Llama,
    prompts: list[list[int]],
    max_tokens: list[int],
    eos_id: int | None,
) -> StaticBatchResult:
    """Greedy generation for a whole batch over one contiguous row per request.

    Args:
        prompts: each request's prompt token ids.
        max_tokens: each request's output budget (the EOS counts as a token, as in the engine).
        eos_id: the token that ends a request early.
    """
    assert len(prompts) == len(max_tokens) and prompts, "one max_tokens per prompt, at least one prompt"
    device, start = model.device, time.perf_counter()
    rows = len(prompts)
    max_len = max(len(p) + m for p, m in zip(prompts, max_tokens))  # the row every request reserves
    cache = ContiguousCache(model.config, rows, max_len, device, model.dtype)
    outputs: list[list[int]] = [[] for _ in range(rows)]
    first_token_s = [0.0] * rows

    def done(r: int) -> bool:
        return outputs[r][-1] == eos_id or len(outputs[r]) >= max_tokens[r]

    for r in range(rows):  # prefill: one request at a time, so no row needs padding
        step = cache.step([r], len(prompts[r]))
        x = torch.tensor([prompts[r]], device=device)  # (1, T)
        logits = model(x, cache.positions([r], len(prompts[r])).to(device), step)  # (1, T, V)
        step.commit()
        outputs[r].append(int(logits[0, -1].argmax()))
        first_token_s[r] = time.perf_counter() - start
    live = [r for r in range(rows) if not done(r)]
    while live:  # decode: one token for every unfinished row
        step = cache.step(live, 1)
        x = torch.tensor([[outputs[r][-1]] for r in live], device=device)  # (B, 1)
        logits = model(x, cache.positions(live, 1).to(device), step)  # (B, 1, V)
        step.commit()
        for r, nxt in zip(live, logits[:, -1].argmax(-1).tolist()):
            outputs[r].append(nxt)
        live = [r for r in live if not done(r)]
    return StaticBatchResult(outputs, first_token_s, rows * max_len)
