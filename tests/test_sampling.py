"""Seeded sampling: the seed decides the text, so one seed repeats and different seeds differ."""

from __future__ import annotations

from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.model.sampling import SamplingParams

# The shipped model is sure of itself on the prompts it was trained on (every seed gives
# "saved memo hi."), which would let a sampler that ignores its seed pass. On a prompt it has
# never seen, its next-token distribution is wide, so the seed really shows in the text.
UNCERTAIN_PROMPT = "q"
SEEDS = range(6)


def sampled_text(tiny, seed: int) -> str:
    model, tok = tiny
    params = SamplingParams(temperature=1.0, top_p=1.0, seed=seed)
    return Engine(model, tok, EngineConfig(num_pages=16)).generate([UNCERTAIN_PROMPT], 20, sampling=params)[0].text


def test_the_same_seed_gives_the_same_text(tiny):
    """Each seed, run twice in fresh engines, gives the same text both times."""
    for seed in SEEDS:
        assert sampled_text(tiny, seed) == sampled_text(tiny, seed), seed


def test_different_seeds_give_different_texts(tiny):
    """Six seeds give at least three different texts: the seed, not a fixed stream, decides."""
    texts = [sampled_text(tiny, seed) for seed in SEEDS]
    assert len(set(texts)) >= 3, texts
