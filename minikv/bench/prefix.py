"""The shared-prefix benchmark: many requests behind a few long system prompts.

Each request is an application's long system prompt (a document of about 700 characters)
followed by one tenant's short note; a few applications serve several tenants. The paged engine
serves the same workload three ways:

    off          prefix caching off: every prompt is prefilled whole
    shared       prefix caching on, cache_salt off: every tenant reuses the system prompt's pages
    cache_salt   prefix caching on, cache_salt on: each tenant reuses only its own pages

All three must return the same completions before any time counts (outputs_equal). Reported:
`speedup` (tokens/s over `off`), `hit_rate` (the share of prompt tokens served from the cache)
and `prefill_tokens_saved` (prompt tokens not prefilled), for `shared` at the top level and for
`cache_salt` under its own key: what the salt costs on a workload built to share.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.model.llama import Llama
from minikv.engine.request import Request
from minikv.attacks.workload import TENANTS, document_sentence, make_prompt, random_note

APPS = ("helpdesk", "notes")  # two applications, each with its own system prompt
SYSTEM_PROMPT_CHARS = 700
MODES = {"off": dict(prefix_caching=False), "shared": dict(prefix_caching=True, cache_salt=False),
         "cache_salt": dict(prefix_caching=True, cache_salt=True)}


@dataclass(frozen=True)
class PrefixRequest:
    prompt: str
    tenant: str
    max_tokens: int


def shared_prefix_workload(num_requests: int = 32, num_tenants: int = 4, seed: int = 0,
                           system_chars: int = SYSTEM_PROMPT_CHARS) -> list[PrefixRequest]:
    """`num_requests` requests: one of two long system prompts, then a tenant's note."""
    rng = random.Random(seed)
    systems = {app: document_sentence(rng, system_chars) for app in APPS}
    tenants = TENANTS[:num_tenants]
    return [PrefixRequest(make_prompt(app, [systems[app], random_note(rng).sentence]), rng.choice(tenants), 16)
            for app in (rng.choice(APPS) for _ in range(num_requests))]


@dataclass
class PrefixRun:
    """One pass of the engine over the workload in one mode."""

    texts: list[str]
    tokens: int  # generated, EOS included
    prompt_tokens: int
    cached_tokens: int
    wall_s: float


def serve(model: Llama, tokenizer: PreTrainedTokenizerBase, workload: list[PrefixRequest], mode: str) -> PrefixRun:
    """The paged engine (audit and event log off) with a pool that holds the whole workload."""
    pages = sum(-(-(len(r.prompt) + r.max_tokens) // 16) for r in workload)
    context = min(1024, model.config.max_position_embeddings)
    engine = Engine(model, tokenizer, EngineConfig(num_pages=pages, context_len=context, audit=False, event_log=False,
                                                   **MODES[mode]))
    start = time.perf_counter()
    ids = [engine.submit(Request(r.prompt, r.tenant, r.max_tokens)) for r in workload]
    answered = {r.request_id: r for r in engine.run()}
    wall = time.perf_counter() - start
    out = [answered[i] for i in ids]
    if any(r.status != 200 for r in out):
        raise RuntimeError(f"the engine refused a benchmark request: {next(r.error for r in out if r.status != 200)}")
    return PrefixRun([r.text for r in out], sum(r.usage.completion_tokens for r in out),
                     sum(r.usage.prompt_tokens for r in out), sum(r.usage.cached_tokens for r in out), wall)


def measure(model: Llama, tokenizer: PreTrainedTokenizerBase, num_requests: int = 32, repeats: int = 3,
            seed: int = 0) -> tuple[dict, bool]:
    """({speedup, prefill_tokens_saved, hit_rate, cache_salt: {...}}, outputs_equal).

    Every mode runs once (its completions are compared), then `repeats` timed runs, interleaved;
    a speedup is the median of the per-repeat ratios of tokens/s. With `repeats=0` (--quick) the
    checked runs are the timed ones.
    """
    system_chars = min(SYSTEM_PROMPT_CHARS, model.config.max_position_embeddings // 2)  # a tiny test model's window
    workload = shared_prefix_workload(num_requests, seed=seed, system_chars=system_chars)
    checked = {mode: serve(model, tokenizer, workload, mode) for mode in MODES}
    equal = all(run.texts == checked["off"].texts for run in checked.values())
    ratios: dict[str, list[float]] = {"shared": [], "cache_salt": []}
    rounds = [checked] if repeats == 0 else (
        {m: serve(model, tokenizer, workload, m) for m in (MODES if r % 2 == 0 else reversed(MODES))} for r in range(repeats))
    for runs in rounds:
        for mode in ratios:
            ratios[mode].append((runs[mode].tokens / runs[mode].wall_s) / (runs["off"].tokens / runs["off"].wall_s))

    def figures(mode: str) -> dict[str, float]:
        run = checked[mode]
        return {"speedup": statistics.median(ratios[mode]), "prefill_tokens_saved": float(run.cached_tokens),
                "hit_rate": run.cached_tokens / run.prompt_tokens}

    return {**figures("shared"), "cache_salt": figures("cache_salt")}, equal
