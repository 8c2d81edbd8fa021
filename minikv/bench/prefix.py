"""The shared-prefix benchmark: requests behind two long system prompts, served in three MODES (caching off,
shared, `cache_salt`) that must return the same completions before any time counts (docs/benchmarks.md)."""

import random
import statistics

from transformers import PreTrainedTokenizerBase

from minikv.attacks.workload import TENANTS, document_sentence, make_prompt, random_note
from minikv.bench.systems import BenchRequest, Run, minikv_paged, paired_ratios
from minikv.model.llama import Llama

APPS = ("helpdesk", "notes")  # two applications, each with its own system prompt
SYSTEM_PROMPT_CHARS = 700
MODES = {"off": dict(prefix_caching=False), "shared": dict(prefix_caching=True, cache_salt=False),
         "cache_salt": dict(prefix_caching=True, cache_salt=True)}


def shared_prefix_workload(num_requests: int = 32, num_tenants: int = 4, seed: int = 0,
                           system_chars: int = SYSTEM_PROMPT_CHARS) -> list[BenchRequest]:
    """`num_requests` requests: one of two long system prompts, then a tenant's note."""
    rng = random.Random(seed)
    systems = {app: document_sentence(rng, system_chars) for app in APPS}
    tenants = TENANTS[:num_tenants]
    return [BenchRequest(make_prompt(app, [systems[app], random_note(rng).sentence]), 16, rng.choice(tenants))
            for app in (rng.choice(APPS) for _ in range(num_requests))]


def serve(model: Llama, tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest], mode: str) -> Run:
    """minikv_paged in one of MODES."""
    return minikv_paged(model, tokenizer, workload, context_len=min(1024, model.config.max_position_embeddings),
                        **MODES[mode])


def measure(model: Llama, tokenizer: PreTrainedTokenizerBase, num_requests: int = 32, repeats: int = 3,
            seed: int = 0) -> tuple[dict, bool]:
    """({speedup, prefill_tokens_saved, hit_rate, cache_salt: {the same three}}, outputs_equal): each mode
    once, compared, then `repeats` interleaved rounds (none: the checked ones are timed); paired medians."""
    system_chars = min(SYSTEM_PROMPT_CHARS, model.config.max_position_embeddings // 2)  # a tiny test model's window
    workload = shared_prefix_workload(num_requests, seed=seed, system_chars=system_chars)
    checked = {mode: serve(model, tokenizer, workload, mode) for mode in MODES}
    equal = all(run.texts == checked["off"].texts for run in checked.values())
    rounds = [checked] if repeats == 0 else [
        {m: serve(model, tokenizer, workload, m) for m in (MODES if r % 2 == 0 else reversed(MODES))} for r in range(repeats)]

    def figures(mode: str) -> dict[str, float]:
        speedup = statistics.median(paired_ratios([runs[mode] for runs in rounds], [runs["off"] for runs in rounds]))
        return {"speedup": speedup, "prefill_tokens_saved": float(checked[mode].cached_tokens),
                "hit_rate": checked[mode].cached_tokens / checked[mode].prompt_tokens}

    return {**figures("shared"), "cache_salt": figures("cache_salt")}, equal
