"""Prompts the endpoint has never seen, and how many tokens they make on its tokenizer.

Gu et al. ("Auditing Prompt Caching in Language Model APIs", ICML 2025) build audit prompts
from random letters separated by spaces: no two prompts share a prefix by accident, and most
tokenizers spend about the same number of tokens on every word. The probe cannot see the
endpoint's tokenizer, so it measures it: two calibration prompts give the tokens per word and
the fixed overhead from `usage.prompt_tokens`, and every later prompt is sized with that line.
"""

from __future__ import annotations

import math
import random
import string
from dataclasses import dataclass


def random_words(rng: random.Random, words: int) -> str:
    """`words` random lowercase letters separated by spaces, ending in a newline."""
    return " ".join(rng.choice(string.ascii_lowercase) for _ in range(words)) + "\n"


@dataclass(frozen=True)
class TokenScale:
    """prompt_tokens = overhead + per_word x words, fitted on this endpoint."""

    overhead: float
    per_word: float

    @classmethod
    def fit(cls, words: tuple[int, int], tokens: tuple[int, int]) -> "TokenScale":
        per_word = (tokens[1] - tokens[0]) / (words[1] - words[0])
        return cls(tokens[0] - per_word * words[0], per_word)

    def tokens(self, words: int) -> int:
        return round(self.overhead + self.per_word * words)

    def words_for(self, tokens: int) -> int:
        """The most words whose prompt stays within `tokens` (at least 1)."""
        return max(1, math.floor((tokens - self.overhead) / self.per_word))

    def words_over(self, tokens: int) -> int:
        """The fewest words whose prompt is longer than `tokens`."""
        return max(1, math.floor((tokens - self.overhead) / self.per_word) + 1)
