"""Same tokens everywhere: minikv (contiguous and paged, batched) and transformers' generate."""

from __future__ import annotations

import random

import torch
from transformers import AutoModelForCausalLM

from minikv.model.checkpoint import default_model_dir
from minikv.engine.config import EngineConfig
from minikv.model.decoding import generate_with_cache, generate_without_cache
from minikv.engine.engine import Engine
from minikv.engine.request import Request
from minikv.attacks.workload import TENANTS, document_sentence, make_prompt, random_note


def random_prompt(rng: random.Random) -> str:
    sentences = [random_note(rng).sentence]
    if rng.random() < 0.5:
        sentences.insert(rng.randint(0, 1), document_sentence(rng, rng.randint(10, 120)))
    return make_prompt(rng.choice(TENANTS), sentences)


def hf_greedy(hf, tok, prompt: str, max_new_tokens: int) -> list[int]:
    x = torch.tensor([tok.encode(prompt)])
    y = hf.generate(x, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    return y[0, x.shape[1]:].tolist()


def test_greedy_generation_matches_transformers_on_20_prompts(tiny):
    """Our cached and uncached greedy decoding give transformers' tokens on 20 prompts."""
    model, tok = tiny
    hf = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval()
    rng = random.Random(20)
    for _ in range(20):
        prompt, n = random_prompt(rng), rng.randint(1, 48)
        ids = tok.encode(prompt)
        ours = generate_with_cache(model, ids, n, tok.eos_token_id)
        assert ours == hf_greedy(hf, tok, prompt, n), prompt
        assert ours == generate_without_cache(model, ids, n, tok.eos_token_id)


def test_paged_engine_matches_contiguous_and_transformers_on_50_mixes(tiny):
    """50 random batches (1-6 prompts, mixed lengths and max_tokens, pools of several sizes):
    the batched paged engine's tokens equal one-at-a-time contiguous decoding and transformers,
    and the small pools really did preempt requests along the way."""
    model, tok = tiny
    hf = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval()
    rng = random.Random(50)
    preempted_mixes = 0
    for mix in range(50):
        prompts = [random_prompt(rng) for _ in range(rng.randint(1, 6))]
        max_tokens = [rng.randint(1, 40) for _ in prompts]
        page_size = rng.choice([4, 16])
        pages = rng.choice([192, 384, 4096]) // page_size  # small pools force waiting and preemption (asserted below)
        engine = Engine(model, tok, EngineConfig(num_pages=pages, page_size=page_size, event_log=True))

        ids = [engine.submit(Request(p, "t", m)) for p, m in zip(prompts, max_tokens)]
        seqs = {rid: engine.seqs[rid] for rid in ids}  # the engine forgets a request once answered
        engine.run()
        for rid, prompt, m in zip(ids, prompts, max_tokens):
            got = seqs[rid].output_ids
            want = generate_with_cache(model, tok.encode(prompt), m, tok.eos_token_id)
            assert got == want, (mix, prompt)
            if mix % 5 == 0:  # transformers is slow; every fifth mix is enough to pin it
                assert got == hf_greedy(hf, tok, prompt, m), (mix, prompt)
        assert engine.pool.num_free_pages == pages and engine.audit.violations == 0
        preempted_mixes += bool(engine.log.of_kind("preempt"))
    assert preempted_mixes >= 5, f"only {preempted_mixes} of 50 mixes preempted: the pools no longer force it"
