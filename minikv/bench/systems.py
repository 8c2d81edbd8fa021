"""The systems the benchmark races (docs/benchmarks.md), each a function of the workload that returns a `Run`,
timed from handing over the whole workload to the last token; all decode greedily."""

import logging
import time
from dataclasses import dataclass, field
from http import HTTPStatus

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerBase
from transformers.generation.streamers import BaseStreamer

from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import SafetySwitches
from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.engine.front_door import FrontDoor
from minikv.engine.request import Request
from minikv.model.contiguous_cache import ContiguousCache
from minikv.model.llama import Llama
from minikv.model.tokenizer import decode, encode_text


@dataclass(frozen=True)
class BenchRequest:
    """One request of the workload: a prompt, its output budget in tokens, and who sends it."""

    prompt: str
    max_tokens: int
    tenant: str = "bench"


@dataclass(frozen=True)
class Completion:
    """What a client sees: the text (no EOS) and how many tokens were generated (EOS included)."""

    text: str
    tokens: int


@dataclass
class Run:
    """One pass of one system over the workload; a completion is None where its request failed."""

    completions: list[Completion | None]
    ttft_s: list[float]  # per request answered, from the moment the workload was handed over
    wall_s: float
    itl_s: list[float] = field(default_factory=list)  # over HTTP, per request: (last token - first) / (tokens - 1)
    prompt_tokens: int = 0  # the engine's usage, summed over the requests
    cached_tokens: int = 0

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.completions if c)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def texts(self) -> list[str | None]:
        return [c.text if c else None for c in self.completions]


def paired_ratios(of: list[Run], over: list[Run]) -> list[float]:
    """`of`'s tokens/s over `over`'s, run by run: two runs seconds apart, slowed alike by a drifting host."""
    return [a.tokens_per_s / b.tokens_per_s for a, b in zip(of, over)]


def completion(tokenizer: PreTrainedTokenizerBase, ids: list[int], max_tokens: int) -> Completion:
    """Cut generated `ids` where the engine would stop (first EOS, or max_tokens) and decode."""
    eos = tokenizer.eos_token_id
    ids = list(ids[:max_tokens])
    if eos in ids:
        ids = ids[: ids.index(eos) + 1]
    return Completion(decode(tokenizer, [t for t in ids if t != eos]), len(ids))


def prompt_ids(tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest]) -> list[list[int]]:
    return [encode_text(tokenizer, r.prompt) for r in workload]


def pages_to_hold(tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest], page_size: int) -> int:
    """Pages that hold every request at its longest at once: a pool that never has to preempt."""
    return sum(-(-(len(p) + r.max_tokens) // page_size) for p, r in zip(prompt_ids(tokenizer, workload), workload))


# -- transformers -----------------------------------------------------------------------------
def greedy_config(tokenizer: PreTrainedTokenizerBase, max_new_tokens: int) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)


class FirstTokenClock(BaseStreamer):
    """A streamer that notes when the first generated tokens arrive (the prompt comes first)."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []

    def put(self, value) -> None:
        if len(self.arrivals) < 2:
            self.arrivals.append(time.perf_counter())

    def end(self) -> None:
        pass


@torch.inference_mode()
def hf_sequential(hf: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest]) -> Run:
    """`generate` for one request after another; a request's TTFT includes the wait for those before it."""
    start = time.perf_counter()
    completions, ttft = [], []
    for req, ids in zip(workload, prompt_ids(tokenizer, workload)):
        x = torch.tensor([ids], device=hf.device)  # (1, T)
        clock = FirstTokenClock()
        out = hf.generate(x, attention_mask=torch.ones_like(x), generation_config=greedy_config(tokenizer, req.max_tokens),
                          streamer=clock)
        completions.append(completion(tokenizer, out[0, len(ids):].tolist(), req.max_tokens))
        ttft.append(clock.arrivals[1] - start)
    return Run(completions, ttft, time.perf_counter() - start)


@torch.inference_mode()
def hf_generate_batch(hf: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest],
                      page_size: int = 16) -> Run:
    """transformers' continuous batching (what `generate_batch` wraps), fed request by request; a fresh one
    each run (a cached one keeps its first size), its KV cache sized to the workload, prefix sharing off."""
    prompts = prompt_ids(tokenizer, workload)
    cb_config = ContinuousBatchingConfig(page_size=page_size, num_blocks=pages_to_hold(tokenizer, workload, page_size)
                                         + len(workload), max_batch_tokens=2048, allow_block_sharing=False)
    gen_config = greedy_config(tokenizer, max(r.max_tokens for r in workload))
    quiet = logging.getLogger("ContinuousBatchingLogger")
    level, quiet.level = quiet.level, logging.CRITICAL  # it logs an error on every CPU start: "no psutil"
    try:
        with hf.continuous_batching_context_manager(generation_config=gen_config, continuous_batching_config=cb_config,
                                                    block=True, timeout=5) as manager:
            start = time.perf_counter()
            request_ids = [manager.add_request(p, max_new_tokens=r.max_tokens, eos_token_id=tokenizer.eos_token_id,
                                               record_timestamps=True) for p, r in zip(prompts, workload)]
            results = {}
            while len(results) < len(request_ids):
                result = manager.get_result(timeout=1)
                if result is not None and result.is_finished():
                    if result.error is not None:
                        raise RuntimeError(f"transformers' continuous batching failed a request: {result.error}")
                    results[result.request_id] = result
                elif result is None and not manager.is_running():
                    raise RuntimeError("transformers' continuous batching thread stopped before finishing")
            wall = time.perf_counter() - start
    finally:
        quiet.level = level
    outs = [results[i] for i in request_ids]
    completions = [completion(tokenizer, o.generated_tokens, r.max_tokens) for o, r in zip(outs, workload)]
    return Run(completions, [o.timestamps[0] - start if o.timestamps else wall for o in outs], wall)


# -- minikv ----------------------------------------------------------------------------------
@torch.inference_mode()
def minikv_contiguous(model: Llama, tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest]) -> Run:
    """Static batching over a contiguous cache (before page pools): a row of the longest prompt + max_tokens
    per request; each prompt prefilled alone, then every unfinished row decodes a token a step."""
    start, device = time.perf_counter(), model.device
    prompts, budgets = prompt_ids(tokenizer, workload), [r.max_tokens for r in workload]
    cache = ContiguousCache(model.config, len(prompts), max(len(p) + m for p, m in zip(prompts, budgets)), device,
                            model.dtype)
    outputs: list[list[int]] = [[] for _ in prompts]
    first_token_s = [0.0] * len(prompts)
    for r, prompt in enumerate(prompts):  # prefill: one request at a time, so no row needs padding
        step = cache.step([r], len(prompt))
        x = torch.tensor([prompt], device=device)  # (1, T)
        logits = model(x, cache.positions([r], len(prompt)).to(device), step)  # (1, T, V)
        step.commit()
        outputs[r].append(int(logits[0, -1].argmax()))
        first_token_s[r] = time.perf_counter() - start
    live = range(len(prompts))
    while live := [r for r in live if outputs[r][-1] != tokenizer.eos_token_id and len(outputs[r]) < budgets[r]]:
        step = cache.step(live, 1)  # decode: one token for every unfinished row
        x = torch.tensor([[outputs[r][-1]] for r in live], device=device)  # (B, 1)
        logits = model(x, cache.positions(live, 1).to(device), step)  # (B, 1, V)
        step.commit()
        for r, nxt in zip(live, logits[:, -1].argmax(-1).tolist()):
            outputs[r].append(nxt)
    wall = time.perf_counter() - start
    return Run([completion(tokenizer, ids, m) for ids, m in zip(outputs, budgets)], first_token_s, wall)


def serve_all(door: FrontDoor, workload: list[BenchRequest]) -> Run:
    """Hand a front door the whole workload at once and run it to the end; every answer must be a 200."""
    start = time.perf_counter()
    ids = [door.submit(Request(r.prompt, r.tenant, r.max_tokens)) for r in workload]
    answered = {r.request_id: r for r in door.run()}
    wall = time.perf_counter() - start
    responses = [answered[i] for i in ids]
    bad = [r for r in responses if r.status != HTTPStatus.OK]
    if bad:
        raise RuntimeError(f"{type(door).__name__} answered {bad[0].status} to a benchmark request: {bad[0].error}")
    return Run([Completion(r.text, r.usage.completion_tokens) for r in responses], [r.ttft_s for r in responses], wall,
               prompt_tokens=sum(r.usage.prompt_tokens for r in responses),
               cached_tokens=sum(r.usage.cached_tokens for r in responses))


def minikv_paged(model: Llama, tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest],
                 page_size: int = 16, **config) -> Run:
    """The paged engine, with audit and event log off, a pool that holds the whole workload, and `config`; the
    whole workload runs at once unless `max_batch_size` says otherwise."""
    config = EngineConfig(page_size=page_size, num_pages=pages_to_hold(tokenizer, workload, page_size),
                          audit=False, event_log=False, **{"max_batch_size": len(workload), **config})
    return serve_all(Engine(model, tokenizer, config), workload)


def pair(model: Llama, tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest],
         switches: SafetySwitches, page_size: int = 16) -> Run:
    """The disaggregated pair under `switches`, pools fitting the workload and window; 64 pages a tick, as an
    RDMA link carries a prompt's KV within a step (1 a tick is the late-write lesson)."""
    config = ClusterConfig(page_size=page_size, prefill_pages=128,
                           decode_pages=max(256, pages_to_hold(tokenizer, workload, page_size)),
                           transfer_pages_per_tick=64, audit=False, event_log=False)
    return serve_all(Cluster(model, tokenizer, config, switches), workload)
