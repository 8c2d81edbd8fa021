"""Choosing the next token: greedy by default, or seeded temperature / top-p sampling."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; a seed makes sampling reproducible per request."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def problem(self) -> str | None:
        """Why these values are invalid, or None."""
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) or self.temperature < 0:
            return f"temperature must be a finite number >= 0, got {self.temperature!r}"
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            return f"top_p must be in (0, 1], got {self.top_p!r}"
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            return f"seed must be a non-negative integer, got {self.seed!r}"
        return None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample_next(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id from logits (V,)."""
    if params.greedy:
        return int(logits.argmax())
    probs = torch.softmax(logits.float().cpu() / params.temperature, dim=-1)  # (V,)
    if params.top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(0) - sorted_p < params.top_p  # smallest set reaching top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=generator))
