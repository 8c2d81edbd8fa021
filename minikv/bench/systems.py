"""The systems the benchmark races: transformers three ways, minikv three ways.

Each runner takes the same workload and returns a `Run`: what every request got back and
when its first token came, timed from the moment the whole workload is handed over until
the last token. Setup (building an engine, starting transformers' batching thread) is not
timed, for any system. Every runner decodes greedily, so every runner must return the same
completions; bench.py checks that before it reports any time.

    hf_sequential       transformers `generate`, one request at a time (its default cache)
    hf_padded           transformers `generate` on the whole batch, left-padded
    hf_generate_batch   transformers' continuous batching (the manager `generate_batch` wraps)
    minikv_contiguous   static batch, one max-length row per request (static_batch.py beside this file)
    minikv_paged        the paged engine (engine.py)
    pair                the disaggregated prefill/decode pair under some safety switches
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from http import HTTPStatus

import torch
from transformers import GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerBase
from transformers.generation.streamers import BaseStreamer

from minikv.engine.config import EngineConfig
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import SafetySwitches
from minikv.engine.engine import Engine
from minikv.model.llama import Llama
from minikv.engine.request import Request
from minikv.bench.static_batch import generate_static_batch
from minikv.model.tokenizer import decode, encode_text

TENANT = "bench"


@dataclass(frozen=True)
class BenchRequest:
    """One request of the workload: a prompt and its output budget in tokens."""

    prompt: str
    max_tokens: int


@dataclass(frozen=True)
class Completion:
    """What a client sees: the text (no EOS) and how many tokens were generated (EOS included)."""

    text: str
    tokens: int


@dataclass
class Run:
    """One pass of one system over the workload."""

    completions: list[Completion]
    ttft_s: list[float]  # per request, from the moment the workload was handed over
    wall_s: float

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.completions)


def completion(tokenizer: PreTrainedTokenizerBase, ids: list[int], max_tokens: int) -> Completion:
    """Cut generated `ids` where the engine would stop (first EOS, or max_tokens) and decode."""
    eos = tokenizer.eos_token_id
    ids = list(ids[:max_tokens])
    if eos in ids:
        ids = ids[: ids.index(eos) + 1]
    return Completion(decode(tokenizer, [t for t in ids if t != eos]), len(ids))


def prompt_ids(tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest]) -> list[list[int]]:
    return [encode_text(tokenizer, r.prompt) for r in workload]


# -- transformers -----------------------------------------------------------------------------
def greedy_config(tokenizer: PreTrainedTokenizerBase, max_new_tokens: int) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)


class FirstTokenClock(BaseStreamer):
    """A streamer that only notes when the first generated tokens arrive (the prompt comes first)."""

    def __init__(self) -> None:
        self.calls, self.first_token_at = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first_token_at = time.perf_counter()

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
        ttft.append(clock.first_token_at - start)
    return Run(completions, ttft, time.perf_counter() - start)


@torch.inference_mode()
def hf_padded(hf: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest]) -> Run:
    """`generate` on the whole batch: prompts left-padded to the longest, every row runs to the longest budget."""
    start = time.perf_counter()
    prompts = prompt_ids(tokenizer, workload)
    width = max(len(p) for p in prompts)
    x = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts], device=hf.device)  # (B, T)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=hf.device)  # (B, T)
    clock = FirstTokenClock()
    out = hf.generate(x, attention_mask=mask, streamer=clock,
                      generation_config=greedy_config(tokenizer, max(r.max_tokens for r in workload)))
    completions = [completion(tokenizer, row[width:].tolist(), r.max_tokens) for row, r in zip(out, workload)]
    return Run(completions, [clock.first_token_at - start] * len(workload), time.perf_counter() - start)


def hf_generate_batch_problem(hf: LlamaForCausalLM) -> str | None:
    """Why transformers' continuous batching cannot run here, or None."""
    if not hasattr(hf, "generate_batch") or not hasattr(hf, "continuous_batching_context_manager"):
        import transformers

        return f"transformers {transformers.__version__} has no generate_batch (continuous batching came in 4.56)"
    return None


@torch.inference_mode()
def hf_generate_batch(hf: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest],
                      page_size: int = 16) -> Run:
    """transformers' continuous batching: the manager `generate_batch` wraps, fed request by request.

    `generate_batch` gives every request the same max_new_tokens; the manager underneath takes
    one per request, as the other systems do. Its KV cache is sized for the workload (on a CPU
    it would ask psutil), and prefix sharing is off (minikv has none). The clock starts once
    the manager's thread runs and stops before it is shut down: an engine's construction is not
    timed either. A fresh manager each run: a cached one keeps the size of its first workload.
    """
    from transformers import ContinuousBatchingConfig

    prompts = prompt_ids(tokenizer, workload)
    pages = sum(-(-(len(p) + r.max_tokens) // page_size) for p, r in zip(prompts, workload))
    cb_config = ContinuousBatchingConfig(page_size=page_size, num_blocks=pages + len(workload),
                                         max_batch_tokens=2048, allow_block_sharing=False)
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
    ttft = [o.timestamps[0] - start if o.timestamps else wall for o in outs]
    return Run(completions, ttft, wall)


# -- minikv ----------------------------------------------------------------------------------
def pages_to_hold(tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest], page_size: int) -> int:
    """Pages that hold every request at its longest at once: a pool that never has to preempt."""
    return sum(-(-(len(p) + r.max_tokens) // page_size) for p, r in zip(prompt_ids(tokenizer, workload), workload))


def minikv_contiguous(model: Llama, tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest]) -> Run:
    """Static batch over a contiguous cache: one row of the longest length per request."""
    start = time.perf_counter()
    result = generate_static_batch(model, prompt_ids(tokenizer, workload), [r.max_tokens for r in workload],
                                   tokenizer.eos_token_id)
    wall = time.perf_counter() - start
    completions = [completion(tokenizer, ids, r.max_tokens) for ids, r in zip(result.output_ids, workload)]
    return Run(completions, result.first_token_s, wall)


def minikv_paged(model: Llama, tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest],
                 page_size: int = 16, scrub_on_free: bool = False) -> Run:
    """The paged engine, with audit and event log off, and a pool that holds the whole workload."""
    config = EngineConfig(page_size=page_size, num_pages=pages_to_hold(tokenizer, workload, page_size),
                          audit=False, event_log=False)
    engine = Engine(model, tokenizer, config, scrub_on_free=scrub_on_free)
    start = time.perf_counter()
    ids = [engine.submit(Request(r.prompt, TENANT, r.max_tokens)) for r in workload]
    seqs = [engine.seqs[i] for i in ids]  # held here: the engine forgets a request once it is answered
    engine.run()
    wall = time.perf_counter() - start
    completions = [completion(tokenizer, s.output_ids, s.max_tokens) for s in seqs]
    return Run(completions, [s.arrival_s - start + s.first_token_s for s in seqs], wall)


def pair_config(tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest], page_size: int = 16) -> ClusterConfig:
    """A pair whose pools fit the workload and the whole context window (so startup_check passes).

    The fabric moves 64 pages a tick: a real RDMA link carries a prompt's KV in well under one
    engine step. The incident's slow fabric (1 page a tick) would time long transfers out
    under the vulnerable preset, which is the late-write lesson, not a throughput figure.
    """
    return ClusterConfig(page_size=page_size, prefill_pages=128,
                         decode_pages=max(256, pages_to_hold(tokenizer, workload, page_size)),
                         transfer_pages_per_tick=64, audit=False, event_log=False)


def pair(model: Llama, tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest],
         switches: SafetySwitches, page_size: int = 16) -> Run:
    """The disaggregated pair behind its front door, under `switches`."""
    cluster = Cluster(model, tokenizer, pair_config(tokenizer, workload, page_size), switches)
    start = time.perf_counter()
    ids = [cluster.submit(Request(r.prompt, TENANT, r.max_tokens)) for r in workload]
    answered = {r.request_id: r for r in cluster.run()}
    wall = time.perf_counter() - start
    responses = [answered[i] for i in ids]
    bad = [r for r in responses if r.status != HTTPStatus.OK]
    if bad:
        raise RuntimeError(f"the pair answered {bad[0].status} to a benchmark request: {bad[0].error}")
    completions = [Completion(r.text, r.usage.completion_tokens) for r in responses]
    return Run(completions, [r.ttft_s for r in responses], wall)
