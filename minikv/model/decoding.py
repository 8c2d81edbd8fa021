"""Greedy decoding for one request, with and without a KV cache (notebook 01's comparison): without, step
t re-runs all t tokens; with, it runs one and reads t cached keys and values. The tokens are the same."""

import torch

from minikv.attention.dense import DenseAttention, causal_mask
from minikv.model.contiguous_cache import ContiguousCache
from minikv.model.llama import Llama


@torch.inference_mode()
def generate_without_cache(model: Llama, prompt_ids: list[int], max_new_tokens: int,
                           eos_id: int | None) -> list[int]:
    """Recompute every step: feed the whole sequence so far, keep only the last logits."""
    ids = list(prompt_ids)
    out: list[int] = []
    for _ in range(max_new_tokens):
        x = torch.tensor([ids], device=model.device)  # (1, T)
        pos = torch.arange(len(ids), device=model.device)[None]  # (1, T)
        logits = model(x, pos, DenseAttention(causal_mask(1, len(ids), model.device)))  # (1, T, V)
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        if nxt == eos_id:
            break
        ids.append(nxt)
    return out


@torch.inference_mode()
def generate_with_cache(model: Llama, prompt_ids: list[int], max_new_tokens: int,
                        eos_id: int | None) -> list[int]:
    """Prefill the prompt once into a contiguous cache, then feed one token per step."""
    cache = ContiguousCache(model.config, 1, len(prompt_ids) + max_new_tokens, model.device, model.dtype)
    step_ids = list(prompt_ids)
    out: list[int] = []
    for _ in range(max_new_tokens):
        step = cache.step([0], len(step_ids))
        x = torch.tensor([step_ids], device=model.device)  # (1, T): the prompt, then one token
        logits = model(x, cache.positions([0], len(step_ids)).to(model.device), step)  # (1, T, V)
        step.commit()
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        if nxt == eos_id:
            break
        step_ids = [nxt]
    return out
