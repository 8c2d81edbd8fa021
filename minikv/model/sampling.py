"""Choosing the next token: greedy by default, or seeded temperature / top-p sampling that is safe
for any value `problem()` lets through (a temperature or top_p of 1e-300 included)."""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

MAX_TEMPERATURE = 100.0  # far past where sampling is uniform noise; only a typo goes higher


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; a seed makes sampling reproducible per request."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def problem(self) -> tuple[str, str] | None:
        """(the field, why its value is invalid: a one-line 400 naming the value), or None."""
        t, p = self.temperature, self.top_p
        def finite(v: object) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not finite(t) or not 0 <= t <= MAX_TEMPERATURE:
            return "temperature", (f"temperature must be a finite number in [0, {MAX_TEMPERATURE:g}], "
                                   f"got {t!r}")
        if not finite(p) or not 0 < p <= 1:
            return "top_p", f"top_p must be a finite number in (0, 1], got {p!r}"
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not 0 <= self.seed < 2**64):  # torch.Generator's seeds
            return "seed", f"seed must be an integer in [0, 2**64), got {self.seed!r}"
        return None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def new_generator(self) -> torch.Generator | None:
        """The request's own random stream (seed 0 when none is given), or None when greedy."""
        return None if self.greedy else torch.Generator().manual_seed(self.seed or 0)


def sample_next(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id from logits (V,)."""
    if params.greedy:
        return int(logits.argmax())
    logits = logits.double().cpu()  # (V,) float64: 1e-300 is representable, and so is its quotient
    scaled = (logits - logits.max()) / params.temperature  # (V,) the top token scales to exactly 0
    probs = torch.softmax(scaled, dim=-1)  # (V,) at least exp(0) in the sum: never 0 / 0
    if params.top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(0) - sorted_p < params.top_p  # smallest set reaching top_p
        keep[0] = True  # the top token always stays, however small top_p is
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=generator))

